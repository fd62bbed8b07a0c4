package aside

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
	mu     sync.Mutex // guards calls
	calls  map[string]*readCall
	joined func() // set by tests alone, before any do: told of each caller that waits for a read under way
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
			if rg.joined != nil {
				rg.joined()
			}
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

// sharedRead is one read shared by the callers of a value key (readShared).
type sharedRead struct {
	r       readResult
	started uint64 // its number from Engine.starts, before the read (see since)
	epoch   uint64 // the local cache's epoch then
}

// readShared is read for a Guard with a local cache: when a hot key's copy
// expires, its callers in this process share one Redis read instead of
// sending one each, under the rule of join: a read that started before the
// caller serves it only if no write was heard in between (the window of a
// local copy); otherwise the caller reads again. Without a local cache
// only a read that started after the caller serves it: fill uses it so
// for the callers that waited for a flight older than them. The first caller reads in
// its own goroutine, on its own ctx, as a Get without Local does; each of
// the others leaves when its own ctx is done, and reads again if the first
// one gave up (see readGroup). With lockable, the read may take the key's
// lock (see lockWithRead); the result carries it to the caller whose read
// it was, and to no other.
func (g *Engine) readShared(ctx context.Context, id, vkey string, from since, lockable bool) (readResult, error) {
	for range 3 { // a second read already starts after this caller: see below
		sr, shared, err := g.rd.shared.do(ctx, vkey, func(ctx context.Context) (sharedRead, error) {
			sr := sharedRead{started: g.starts.Add(1)}
			if g.local != nil {
				sr.epoch = g.local.epoch.Load()
			}
			var err error
			sr.r, err = g.read(ctx, id, vkey, lockable)
			return sr, err
		})
		if err != nil {
			return readResult{}, err
		}
		if shared {
			// A lock the read took (see lockWithRead) is its caller's,
			// for that caller's flight; the others join the flight.
			sr.r.held = nil
		}
		if !from.startedBefore(sr.started) || g.noWriteHeard(sr.epoch, from.epoch) {
			return sr.r, nil
		}
		// A read older than this caller, and a write heard since: the next
		// one starts after this one ended, so after this caller.
	}
	return g.read(ctx, id, vkey, false) // only if reads were forgotten under it again and again: its own
}
