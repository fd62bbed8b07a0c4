// Package loader makes a cache miss cost one load per key, however many
// goroutines and processes ask at once.
//
// Two layers do it. A Group merges concurrent calls for one key in one process
// into one flight, as golang.org/x/sync/singleflight does, and can answer
// some callers before the flight ends (Group.DoEarly). The flight runs on a
// context detached from the first caller's (context.WithoutCancel, plus the
// Group's Timeout), so one caller that gives up cannot fail the others; each
// caller waits on its own ctx and leaves when that ctx is done. A panic in the
// flight becomes an error wrapping ErrPanic for every caller instead of
// crashing the process (singleflight.DoChan would re-panic on a fresh
// goroutine, where nobody can recover it).
//
// A Coordinator then makes the flights of different processes take turns
// through a Redis lock per key (package lock): one holder loads and writes
// only while the lock still holds its token, while the others wait for its
// PUBLISH on one pub/sub subscription per Coordinator and read what it
// stored. See Coordinator for the order of events and what happens when a
// holder dies.
package loader

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/growstack"
)

// ErrPanic is wrapped by the error every caller gets when a flight panicked.
var ErrPanic = errors.New("loader: load panicked")

// Group merges concurrent flights per key. The zero value is ready to use and
// flights have no timeout; set Timeout before first use to bound them.
//
// It is golang.org/x/sync/singleflight with one thing added, which that
// package cannot express: a flight may answer early (DoEarly), handing a
// result to the callers that can take it while it goes on for the others.
type Group[R any] struct {
	// Timeout bounds each flight (0: none). Read-only after first use.
	Timeout time.Duration

	mu      sync.Mutex            // guards flights and each flight's callers
	flights map[string]*flight[R] // the flight under way per key
}

// flight is one run of a Group's function and what it hands its callers.
// The fields before done are written once, by the flight's goroutine,
// before it closes done (res, err) or early (first, firstErr); callers read
// them after the close.
type flight[R any] struct {
	res         R
	err         error
	first       R
	firstErr    error
	done, early chan struct{}
	earlyOnce   sync.Once
	callers     int // callers that joined, guarded by Group.mu
}

// Do runs fn once for all concurrent callers of key and returns its result to
// each. shared reports whether the result went to more than one caller. If
// ctx ends first, Do returns ctx.Err() at once; the flight goes on (bounded
// by Timeout) for the other callers.
//
// The goroutine that runs a flight belongs to the Group: it is started by the
// first caller with a cancellable ctx and ends when fn returns (with an
// uncancellable ctx the first caller runs fn itself).
func (g *Group[R]) Do(ctx context.Context, key string, fn func(ctx context.Context) (R, error)) (res R, shared bool, err error) {
	return g.DoEarly(ctx, key, func(ctx context.Context, _ func(R, error)) (R, error) { return fn(ctx) }, nil)
}

// DoEarly is Do for a flight that can answer some callers before it ends.
// fn may call early once with a result (a later call is ignored); each
// caller of the flight, present or still to join, for which accept says
// yes to that result returns it then, while the flight goes on and its own
// result goes to the others. With accept nil a caller takes no early
// result. The guard uses it to answer the callers that started before a
// load as soon as the load returns, while the flight writes the value to
// Redis for those that started after.
//
// The flight always runs in a goroutine of its own when accept is set: it
// must outlive callers that leave early. After an early answer that wakes
// more than one caller it yields once (runtime.Gosched) before fn goes
// on. The callers the answer wakes wait in its processor's run queue, and
// what fn does next (the guard's write to Redis) can wake another process
// that takes that processor's core; the Go scheduler does not steal them while its global queue has
// work, so they would wait a slice of the OS scheduler, milliseconds after
// their answer was ready. On the hot key of the guard's benchmark table 4b
// (32 callers, two cores shared with redis-server) a debug build showed the
// last caller of an expiry taking its answer up to 4.6 ms after the first;
// the slowest caller (median of five rounds, four runs each) was 14.07,
// 13.36, 11.13 and 13.53 ms without the yield and 12.18, 10.93, 10.82 and
// 10.94 ms with it (go-redis/cache with its local cache: 10.89 to 11.61 ms
// in the same runs). A flight with its starter alone skips the yield: the
// demo shop's cold Zipf, where nearly every miss is such a flight, served
// about 2% more without it (with the guard's reads taking their locks
// without a PTTL; 13 of 16 alternated runs ahead).
func (g *Group[R]) DoEarly(ctx context.Context, key string, fn func(ctx context.Context, early func(R, error)) (R, error), accept func(R) bool) (res R, shared bool, err error) {
	return g.DoEarlyOnJoin(ctx, key, fn, accept, nil)
}

// DoEarlyOnJoin is DoEarly that calls onJoin (if not nil) when the caller
// joins a flight already under way instead of starting one, before it
// waits for that flight: a caller holding something the flight under way
// may wait for (the guard's callers, a lock their read took) gives it up
// there, or the two would wait for each other.
func (g *Group[R]) DoEarlyOnJoin(ctx context.Context, key string, fn func(ctx context.Context, early func(R, error)) (R, error), accept func(R) bool, onJoin func()) (res R, shared bool, err error) {
	g.mu.Lock()
	f, joined := g.flights[key]
	if !joined {
		f = &flight[R]{done: make(chan struct{}), early: make(chan struct{})}
		if g.flights == nil {
			g.flights = make(map[string]*flight[R])
		}
		g.flights[key] = f
	}
	f.callers++
	g.mu.Unlock()
	if joined && onJoin != nil {
		onJoin()
	}
	if !joined {
		if ctx.Done() == nil && accept == nil { // nobody can leave before the end: run it here
			g.run(ctx, key, f, fn)
			return f.res, g.shared(f), f.err
		}
		go func() {
			growstack.Grow() // a flight makes deep calls (go-redis, the load): see package growstack
			g.run(ctx, key, f, fn)
		}()
	}
	early := f.early
	if accept == nil {
		early = nil
	}
	for {
		select {
		case <-f.done:
			return f.res, g.shared(f), f.err
		case <-early:
			if accept(f.first) {
				return f.first, g.shared(f), f.firstErr
			}
			early = nil // not for this caller: wait for the end
		case <-ctx.Done():
			var zero R
			return zero, false, ctx.Err()
		}
	}
}

// shared reports whether f had more than one caller so far.
func (g *Group[R]) shared(f *flight[R]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return f.callers > 1
}

// run runs fn for flight f of key on a context detached from the first
// caller's, records its result (a panic becomes an error wrapping ErrPanic)
// and ends the flight: the key's next caller starts a new one.
func (g *Group[R]) run(ctx context.Context, key string, f *flight[R], fn func(ctx context.Context, early func(R, error)) (R, error)) {
	fctx := context.WithoutCancel(ctx)
	if g.Timeout > 0 {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(fctx, g.Timeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			var zero R
			f.res, f.err = zero, fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
		g.mu.Lock()
		if g.flights[key] == f {
			delete(g.flights, key)
		}
		g.mu.Unlock()
		close(f.done)
	}()
	f.res, f.err = fn(fctx, func(r R, err error) {
		answered := false
		f.earlyOnce.Do(func() {
			f.first, f.firstErr = r, err
			close(f.early)
			answered = true
		})
		if answered && g.shared(f) {
			runtime.Gosched() // the callers just woken run first: see DoEarly
		}
	})
}

// Forget makes the next call for key start a new flight, even if one is in
// progress (callers already in that flight still get its result).
func (g *Group[R]) Forget(key string) {
	g.mu.Lock()
	delete(g.flights, key)
	g.mu.Unlock()
}
