// Package loader makes a cache miss cost one load per key, however many
// goroutines and processes ask at once.
//
// Two layers do it. A Group merges concurrent calls for one key in one process
// into one flight (golang.org/x/sync/singleflight). The flight runs on a
// context detached from the first caller's (context.WithoutCancel, plus the
// Group's Timeout), so one caller that gives up cannot fail the others; each
// caller waits on its own ctx and leaves when that ctx is done. A panic in the
// flight becomes an error wrapping ErrPanic for every caller instead of
// crashing the process (singleflight.DoChan would re-panic on a fresh
// goroutine, where nobody can recover it).
//
// A Coordinator then makes the flights of different processes take turns
// through a Redis lock per key (package lock): one holder loads, with the
// lock's fencing number for its write, while the others wait for its PUBLISH
// on one pub/sub subscription per Coordinator and read what it stored. See
// Coordinator for the order of events and what happens when a holder dies.
package loader

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"golang.org/x/sync/singleflight"
)

// ErrPanic is wrapped by the error every caller gets when a flight panicked.
var ErrPanic = errors.New("loader: load panicked")

// Group merges concurrent flights per key. The zero value is ready to use and
// flights have no timeout; set Timeout before first use to bound them.
type Group[R any] struct {
	// Timeout bounds each flight (0: none). Read-only after first use.
	Timeout time.Duration

	sf singleflight.Group // one flight per key; it guards its own state
}

// Do runs fn once for all concurrent callers of key and returns its result to
// each. shared reports whether the result went to more than one caller. If
// ctx ends first, Do returns ctx.Err() at once; the flight goes on (bounded
// by Timeout) for the other callers.
//
// The goroutine that runs a flight belongs to the Group: it is started by the
// first caller with a cancellable ctx and ends when fn returns.
func (g *Group[R]) Do(ctx context.Context, key string, fn func(ctx context.Context) (R, error)) (res R, shared bool, err error) {
	run := func() (any, error) { return g.run(ctx, fn) }
	if ctx.Done() == nil { // cannot be cancelled: wait in this goroutine
		v, err, shared := g.sf.Do(key, run)
		r, _ := v.(R)
		return r, shared, err
	}
	select {
	case out := <-g.sf.DoChan(key, run):
		r, _ := out.Val.(R)
		return r, out.Shared, out.Err
	case <-ctx.Done():
		var zero R
		return zero, false, ctx.Err()
	}
}

func (g *Group[R]) run(ctx context.Context, fn func(ctx context.Context) (R, error)) (res any, err error) {
	fctx := context.WithoutCancel(ctx)
	if g.Timeout > 0 {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(fctx, g.Timeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return fn(fctx)
}

// Forget makes the next call for key start a new flight, even if one is in
// progress (callers already in that flight still get its result).
func (g *Group[R]) Forget(key string) { g.sf.Forget(key) }
