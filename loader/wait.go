package loader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/pubsub"
)

// The wait of a flight that found the key's lock held elsewhere (step 4 of
// Coordinator): subscribed, it leaves the waiting mark, reads, and waits for
// the holder's publish, which one subscription per Coordinator fans out to
// the flights of this process (waker).

// wait blocks until the holder publishes key, its lease (holderTTL) runs out,
// or the deadline passes. done reports that f accepted what the cache holds;
// result says how the wait ended (see Wait).
func (c *Coordinator) wait(
	ctx context.Context,
	tg target,
	holderTTL time.Duration,
	deadline time.Time,
	f Fill,
) (done bool, result string, err error) {
	opCtx, cancelOp := c.op(ctx)
	woken, cancel, err := c.wake.register(opCtx, tg.key)
	cancelOp()
	if err != nil {
		return true, "cancelled", err
	}
	defer cancel()
	lease := holderTTL + 5*time.Millisecond
	result = "expired"
	if until := time.Until(deadline); until < lease {
		lease, result = max(until, 0), "timeout"
	}
	// Subscribed: a publish from now on reaches us. Leave the waiting mark,
	// so that the holder publishes, then check before waiting: the holder's
	// script runs before the mark (the HGET behind it sees what it wrote),
	// between the two (the same), or after the HGET (it finds the mark and
	// publishes). The mark outlives this wait; a wait that the holder's
	// renewed lease outlasts marks again on its next round. A holder that
	// released the lock without writing before the mark was left (its load
	// failed, or it was a read's lock given back: see Run's held) published to
	// nobody: the lock's PTTL, read behind the mark, says it is gone, and
	// the flight attempts again at once instead of waiting out the lease.
	r, lockGone := c.markAndRead(ctx, tg, lease)
	if done, err := c.cached(ctx, r, f); done || err != nil {
		return true, "woken", err
	}
	if lockGone {
		return false, "woken", nil
	}
	t := time.NewTimer(lease)
	defer t.Stop()
	select {
	case <-woken:
		c.wakeups.Add(1)
		result = "woken"
	case <-t.C:
	case <-ctx.Done():
		return true, "cancelled", ctx.Err()
	}
	done, err = c.cached(ctx, c.hget(ctx, tg), f)
	return done, result, err
}

// markAndRead leaves key's waiting mark for a wait of lease and reads the
// entry behind it, and whether key's lock is gone, in one round trip
// bounded by OpTimeout.
func (c *Coordinator) markAndRead(ctx context.Context, t target, lease time.Duration) (r reading, lockGone bool) {
	opCtx, cancel := c.op(ctx)
	defer cancel()
	pipe := c.rdb.Pipeline()
	mark := pipe.Set(opCtx, t.waiting, "1", lease+c.opts.OpTimeout)
	get := pipe.HGet(opCtx, t.key, t.field)
	pttl := pipe.PTTL(opCtx, t.lock)
	_, _ = pipe.Exec(opCtx) // errors are read per command
	if err := mark.Err(); err != nil && errors.Is(get.Err(), redis.Nil) {
		get.SetErr(err) // nothing cached, and unmarked a wait could miss the publish: fail as a read would
	}
	return reading{get: get}, pttl.Err() == nil && pttl.Val() == -2 // -2: no such key
}

// hget reads the entry in a round trip of its own, bounded by OpTimeout.
func (c *Coordinator) hget(ctx context.Context, t target) reading {
	opCtx, cancel := c.op(ctx)
	defer cancel()
	return reading{get: c.rdb.HGet(opCtx, t.key, t.field)}
}

// errClosed is returned by register after close.
var errClosed = errors.New("loader: coordinator closed")

// waker fans one Redis pub/sub subscription out to the flights of this
// process that wait for a key: one SUBSCRIBE per Coordinator, opened on the
// first wait, however many keys and flights wait.
type waker struct {
	rdb     redis.UniversalClient
	channel string

	mu      sync.Mutex                            // guards the fields below
	waiters map[string]map[chan struct{}]struct{} // key → channels to close on its message
	sub     *pubsub.Subscription                  // nil until the first register
	closed  bool
}

// register returns a channel that is closed when a message for key arrives.
// The subscription is confirmed before register returns, so a message
// published after that cannot be missed (short of a dropped connection,
// which the caller covers with a timer). cancel forgets the registration.
func (w *waker) register(ctx context.Context, key string) (ch <-chan struct{}, cancel func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, nil, errClosed
	}
	if w.sub == nil {
		sub, err := pubsub.Subscribe(ctx, w.rdb, w.channel, w.dispatch, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("loader: %w", err)
		}
		w.sub, w.waiters = sub, map[string]map[chan struct{}]struct{}{}
	}
	c := make(chan struct{})
	if w.waiters[key] == nil {
		w.waiters[key] = map[chan struct{}]struct{}{}
	}
	w.waiters[key][c] = struct{}{}
	return c, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if set := w.waiters[key]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(w.waiters, key)
			}
		}
	}, nil
}

// dispatch wakes the waiters of the key a message names. It runs on the
// subscription's goroutine.
func (w *waker) dispatch(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.waiters[key] {
		close(c)
	}
	delete(w.waiters, key)
}

// close ends the subscription and waits until dispatch is no longer called.
func (w *waker) close() error {
	w.mu.Lock()
	w.closed = true
	sub := w.sub
	w.mu.Unlock()
	if sub == nil {
		return nil
	}
	return sub.Close()
}
