// Package loader makes a cache miss cost one load per key, however many
// goroutines ask at once, usable without the rest of cacheguard. For the
// callers of one key in one process, a [Group] guarantees:
//   - one flight at a time: callers that arrive while it runs join it and
//     share its result; [Group.Forget] makes the next caller start anew;
//   - the flight runs detached from its first caller's ctx, bounded by
//     Timeout: a caller whose ctx ends leaves at once, the flight goes on;
//   - a panic in the flight reaches every caller as an error wrapping
//     [ErrPanic], with its stack; it never crashes the process.
//
// It is golang.org/x/sync/singleflight with recoverable panics and a typed
// key. Across processes, add a Redis lock per key (package lock: Group's
// example shows both; docs/design.md says what cacheguard adds).
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
// each (shared: to more than one caller). If ctx ends first, Do returns
// ctx.Err() at once; the flight goes on, bounded by Timeout. The flight's
// goroutine is started by its first caller (unless that caller's ctx cannot
// end: it runs fn itself) and ends when fn returns.
func (g *Group[K, R]) Do(ctx context.Context, key K, fn func(ctx context.Context) (R, error)) (res R, shared bool, err error) {
	return g.group().Do(ctx, key, fn)
}

// Forget makes the next call for key start a new flight, even if one is in
// progress (callers already in that flight still get its result).
func (g *Group[K, R]) Forget(key K) { g.group().Forget(key) }
