package loader

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// ErrPanic is wrapped by the error every caller gets when a flight panicked.
var ErrPanic = errors.New("loader: load panicked")

// Group merges concurrent calls per key of type K (the guard's tell a fill
// from a load-through and a refresh) into one flight whose result, of type
// R, every caller gets. The zero value is ready to use and flights have no
// timeout; set Timeout before first use to bound them.
//
// It is golang.org/x/sync/singleflight with what that package cannot do: the
// flight runs on a context detached from the first caller's, each caller
// leaves on its own ctx, and a panic reaches every caller as an error
// (singleflight.DoChan re-panics on a goroutine nobody can recover).
type Group[K comparable, R any] struct {
	// Timeout bounds each flight (0: none). Read-only after first use.
	Timeout time.Duration
	// Spawn, if set, starts the goroutine a flight runs in, so that its
	// owner can stop and wait for it (nil: a go statement). Read-only
	// after first use.
	Spawn func(func())
	// InCaller runs each flight in its first caller's goroutine, on that
	// caller's ctx (Timeout does not apply): for a short call, a Redis read
	// say, that needs no goroutine of its own. A flight that failed because
	// its caller's ctx ended answers nobody else: they run it again.
	// Read-only after first use.
	InCaller bool

	mu      sync.Mutex       // guards flights and each flight's callers
	flights map[K]*flight[R] // the flight under way per key
}

// flight is one run of a Group's function. res and err are written once, by
// the flight's goroutine, before it closes done; callers read them after.
type flight[R any] struct {
	res     R
	err     error
	done    chan struct{}
	callers int // callers that joined, guarded by Group.mu
}

// Do runs fn once for all concurrent callers of key and returns its result to
// each. shared reports whether the result went to more than one caller. If
// ctx ends first, Do returns ctx.Err() at once; the flight goes on (bounded
// by Timeout) for the other callers. The goroutine that runs a flight is
// started by its first caller (unless that caller's ctx cannot end, or the
// Group runs flights InCaller, and it runs fn itself) and ends when fn
// returns.
func (g *Group[K, R]) Do(ctx context.Context, key K, fn func(ctx context.Context) (R, error)) (res R, shared bool, err error) {
	return g.DoOnJoin(ctx, key, fn, nil)
}

// DoOnJoin is Do that calls onJoin (if not nil) when the caller joins a
// flight already under way, before it waits: a caller holding something
// that flight may wait for (the guard's callers, a lock their read took)
// gives it up there, or the two would wait for each other.
func (g *Group[K, R]) DoOnJoin(ctx context.Context, key K, fn func(ctx context.Context) (R, error), onJoin func()) (
	res R, shared bool, err error,
) {
	for {
		g.mu.Lock()
		f, joined := g.flights[key]
		if !joined {
			f = &flight[R]{done: make(chan struct{})}
			if g.flights == nil {
				g.flights = make(map[K]*flight[R])
			}
			g.flights[key] = f
		}
		f.callers++
		g.mu.Unlock()
		if joined && onJoin != nil {
			onJoin()
		}
		if !joined {
			if g.InCaller || ctx.Done() == nil { // (or nobody can leave before the end): run it here
				g.run(ctx, key, f, fn, !g.InCaller)
				return f.res, g.shared(f), f.err
			}
			g.start(ctx, key, f, fn)
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			var zero R
			return zero, false, ctx.Err()
		}
		if g.InCaller && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) {
			continue // its caller gave up: run it again
		}
		return f.res, g.shared(f), f.err
	}
}

// Go starts fn as key's flight unless one is under way, and returns at
// once: it reports whether it started one. Nobody waits for that flight (a
// refresh ahead of expiry, say); callers of Do that arrive while it runs
// join it. It runs as Do's flights do, InCaller or not: on ctx without its
// cancellation, bounded by Timeout, in a goroutine of Spawn's.
func (g *Group[K, R]) Go(ctx context.Context, key K, fn func(ctx context.Context) (R, error)) bool {
	g.mu.Lock()
	if _, ok := g.flights[key]; ok {
		g.mu.Unlock()
		return false
	}
	f := &flight[R]{done: make(chan struct{}), callers: 1} // its starter counts as a caller: a joiner shares
	if g.flights == nil {
		g.flights = make(map[K]*flight[R])
	}
	g.flights[key] = f
	g.mu.Unlock()
	g.start(ctx, key, f, fn)
	return true
}

// start runs flight f of key in a goroutine of Spawn's (or a go statement).
func (g *Group[K, R]) start(ctx context.Context, key K, f *flight[R], fn func(ctx context.Context) (R, error)) {
	spawn := g.Spawn
	if spawn == nil {
		spawn = func(run func()) { go run() }
	}
	spawn(func() { g.run(ctx, key, f, fn, true) })
}

// shared reports whether f had more than one caller so far.
func (g *Group[K, R]) shared(f *flight[R]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return f.callers > 1
}

// run runs fn for flight f of key on a context detached from the first
// caller's and bounded by Timeout (unless detach is false: InCaller, on
// that ctx), records its result (a panic becomes an error wrapping ErrPanic)
// and ends the flight: the key's next caller starts a new one.
func (g *Group[K, R]) run(ctx context.Context, key K, f *flight[R], fn func(ctx context.Context) (R, error), detach bool) {
	fctx := ctx // InCaller: the caller's own
	if detach {
		fctx = context.WithoutCancel(ctx)
	}
	if g.Timeout > 0 && detach {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(fctx, g.Timeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			var zero R
			stack := debug.Stack()
			if s, ok := p.(interface{ PanicStack() []byte }); ok { // it began elsewhere: that stack says where
				stack = s.PanicStack()
			}
			f.res, f.err = zero, fmt.Errorf("%w: %v\n%s", ErrPanic, p, stack)
		}
		g.mu.Lock()
		if g.flights[key] == f {
			delete(g.flights, key)
		}
		g.mu.Unlock()
		close(f.done)
	}()
	f.res, f.err = fn(fctx)
}

// Forget makes the next call for key start a new flight, even if one is in
// progress (callers already in that flight still get its result).
func (g *Group[K, R]) Forget(key K) {
	g.mu.Lock()
	delete(g.flights, key)
	g.mu.Unlock()
}
