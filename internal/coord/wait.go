package coord

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
)

// wait blocks until the holder publishes key, its lease (holderTTL) runs out,
// or the deadline passes. done reports that f accepted what the cache holds;
// result says how the wait ended (see Options.OnWaited).
func (c *Coordinator) wait(
	ctx context.Context,
	key, field string,
	holderTTL time.Duration,
	deadline time.Time,
	f Fill,
) (done bool, result string, err error) {
	opCtx, cancelOp := c.op(ctx)
	woken, cancel, err := c.wake.register(opCtx, key)
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
	r, lockGone := c.markAndRead(ctx, key, field, lease)
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
	done, err = c.cached(ctx, c.hget(ctx, key, field), f)
	return done, result, err
}

// markAndRead leaves key's waiting mark for a wait of lease and reads the
// entry behind it, and whether key's lock is gone, in one round trip
// bounded by OpTimeout.
func (c *Coordinator) markAndRead(ctx context.Context, key, field string, lease time.Duration) (r reading, lockGone bool) {
	opCtx, cancel := c.op(ctx)
	defer cancel()
	pipe := c.rdb.Pipeline()
	mark := pipe.Set(opCtx, keyspace.Waiting(key), "1", lease+c.opts.OpTimeout)
	get := pipe.HGet(opCtx, key, field)
	pttl := pipe.PTTL(opCtx, keyspace.Lock(key))
	_, _ = pipe.Exec(opCtx) // errors are read per command
	if err := mark.Err(); err != nil && errors.Is(get.Err(), redis.Nil) {
		get.SetErr(err) // nothing cached, and unmarked a wait could miss the publish: fail as a read would
	}
	return reading{get: get}, pttl.Err() == nil && pttl.Val() == -2 // -2: no such key
}

// hget reads the entry in a round trip of its own, bounded by OpTimeout.
func (c *Coordinator) hget(ctx context.Context, key, field string) reading {
	opCtx, cancel := c.op(ctx)
	defer cancel()
	return reading{get: c.rdb.HGet(opCtx, key, field)}
}
