// Package loader makes a cache miss cost one load per key, however many
// goroutines ask at once, usable without the rest of cacheguard.
//
// What a [Group] guarantees, for the callers of one key in one process:
//
//   - One flight at a time: callers that arrive while a flight runs join it
//     and get its result (shared says so); the next caller after it ends
//     starts a new one, and [Group.Forget] makes it start one at once
//     (after a write, so that nobody takes an answer read before it).
//   - The flight runs on a context detached from its first caller's, bounded
//     by Timeout: a caller whose ctx ends leaves at once with ctx.Err(), and
//     the flight goes on for the others.
//   - A panic in the flight reaches every caller as an error wrapping
//     [ErrPanic], with the panic's stack; it does not crash the process.
//
// It is golang.org/x/sync/singleflight with what that package cannot do
// (singleflight.DoChan re-panics on a goroutine nobody can recover) and a
// key of the caller's type. Across processes, one load per key takes a
// Redis lock per key besides (package lock; the example of Group shows
// the two together). cacheguard's guard does that with a protocol of its
// own (internal/coord), whose waiters are woken by a PUBLISH instead of
// polling: docs/design.md says why it is not here.
package loader

import (
	"context"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/flightgroup"
)

// ErrPanic is wrapped by the error every caller gets when a flight panicked.
var ErrPanic = flightgroup.ErrPanic

// Group merges concurrent calls per key of type K into one flight whose
// result, of type R, every caller gets. The zero value is ready to use and
// flights have no timeout; set Timeout before first use to bound them.
type Group[K comparable, R any] struct {
	// Timeout bounds each flight (0: none). Read-only after first use.
	Timeout time.Duration

	once sync.Once
	g    flightgroup.Group[K, R] // the engine, shared with the guard's flights
}

func (g *Group[K, R]) group() *flightgroup.Group[K, R] {
	g.once.Do(func() { g.g.Timeout = g.Timeout })
	return &g.g
}

// Do runs fn once for all concurrent callers of key and returns its result to
// each. shared reports whether the result went to more than one caller. If
// ctx ends first, Do returns ctx.Err() at once; the flight goes on (bounded
// by Timeout) for the other callers. The goroutine that runs a flight is
// started by its first caller (unless that caller's ctx cannot end: it runs
// fn itself) and ends when fn returns.
func (g *Group[K, R]) Do(ctx context.Context, key K, fn func(ctx context.Context) (R, error)) (res R, shared bool, err error) {
	return g.group().Do(ctx, key, fn)
}

// Forget makes the next call for key start a new flight, even if one is in
// progress (callers already in that flight still get its result).
func (g *Group[K, R]) Forget(key K) { g.group().Forget(key) }
