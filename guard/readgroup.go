package guard

import (
	"context"
	"errors"
	"sync"
)

// readGroup lets the callers of a value key in this process share one Redis
// read (readShared, with Options.Local). The first caller reads in its own
// goroutine, on its own context, as a Get without a local cache does; the
// others wait for that read or for their own ctx, whichever ends first. A
// read that failed because its caller's ctx ended answers nobody else: the
// callers waiting for it start another. It replaces a loader.Group here:
// that one runs every read on a goroutine of its own with a detached,
// timed context, which a read bounded by the Redis client's own timeouts
// does not need, at 8 allocations and a timer per read.
type readGroup struct {
	mu    sync.Mutex // guards calls
	calls map[string]*readCall
}

// readCall is one read under way; done is closed when sr and err are set.
type readCall struct {
	done chan struct{}
	sr   sharedRead
	err  error
}

// do returns the result of the read of key under way, or runs fn as that
// read. shared reports that the result came from another caller's read.
func (rg *readGroup) do(ctx context.Context, key string, fn func(context.Context) (sharedRead, error)) (sr sharedRead, shared bool, err error) {
	for {
		rg.mu.Lock()
		if c, ok := rg.calls[key]; ok {
			rg.mu.Unlock()
			select {
			case <-c.done:
			case <-ctx.Done():
				return sharedRead{}, false, ctx.Err()
			}
			if errors.Is(c.err, context.Canceled) || errors.Is(c.err, context.DeadlineExceeded) {
				continue // its caller gave up: read again
			}
			return c.sr, true, c.err
		}
		c := &readCall{done: make(chan struct{})}
		if rg.calls == nil {
			rg.calls = make(map[string]*readCall)
		}
		rg.calls[key] = c
		rg.mu.Unlock()
		return rg.run(ctx, key, c, fn)
	}
}

// run runs fn as c and hands its result to the callers waiting for c; if fn
// panics, they are told the read was cancelled (and read again) while the
// panic goes on up this caller's stack.
func (rg *readGroup) run(ctx context.Context, key string, c *readCall, fn func(context.Context) (sharedRead, error)) (sharedRead, bool, error) {
	c.err = context.Canceled
	defer func() {
		rg.forget(key, c)
		close(c.done)
	}()
	c.sr, c.err = fn(ctx)
	return c.sr, false, c.err
}

// forget makes the next caller of key start a new read (the callers already
// waiting for c still get its result). A nil c forgets whichever read is
// under way.
func (rg *readGroup) forget(key string, c *readCall) {
	rg.mu.Lock()
	if cur, ok := rg.calls[key]; ok && (c == nil || cur == c) {
		delete(rg.calls, key)
	}
	rg.mu.Unlock()
}
