package coord

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/lock"
)

// reading is a read of a key's field, with the key's PTTL when the attempt
// asked for it (pttl nil: not asked).
type reading struct {
	get  *redis.StringCmd
	pttl *redis.DurationCmd
}

// cached reads a reading's reply: done when f accepts what the cache holds.
// A TTLFiller is given the entry's TTL when the reading carries one.
func (c *Coordinator) cached(ctx context.Context, r reading, f Filler) (done bool, err error) {
	raw, err := r.get.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return true, fmt.Errorf("coord: read: %w", redisfail.Wrap(err))
	}
	if tf, ok := f.(TTLFiller); ok && r.pttl != nil {
		if ttl, err := r.pttl.Result(); err == nil && ttl > 0 {
			return tf.CachedTTL(ctx, raw, ttl), nil
		}
	}
	return f.Cached(ctx, raw), nil
}

// hold runs steps 2 to 4 with the lock held: the re-check's answer, the load,
// and the write with the release and publish, or the release and publish
// alone when it did not get that far (also when the load panics). It
// returns errOvertaken when the write was refused.
func (c *Coordinator) hold(ctx context.Context, l *lock.Lock, key, field string, get reading, f Filler) error {
	stop := l.KeepAlive(ctx, c.opts.LockTTL, func(err error) {
		if c.opts.OnLockLost != nil {
			c.opts.OnLockLost(key, err)
		}
	})
	released := false
	defer func() {
		stop()
		if released {
			return
		}
		_ = c.Release(context.WithoutCancel(ctx), l, key)
	}()
	if done, err := c.cached(ctx, get, f); done || err != nil {
		return err
	}
	frame, ttl, err := f.Load(ctx)
	if err != nil {
		return err
	}
	stop() // before the release: the watchdog must not renew a lock it no longer holds
	opCtx, cancel := c.op(ctx)
	defer cancel()
	keys := []string{key, keyspace.Lock(key), keyspace.Waiting(key)}
	args := []any{field, frame, max(ttl.Milliseconds(), 1), l.Token(), c.channel}
	var cmd *redis.Cmd
	err = c.send(opCtx, func(ctx context.Context, pipe redis.Pipeliner) {
		cmd = writeRelease.EvalSha(ctx, pipe, keys, args...)
	})
	var reply any
	if err == nil {
		reply, err = cmd.Result()
		if redis.HasErrorPrefix(err, "NOSCRIPT") { // not run: send the script itself
			reply, err = writeRelease.Eval(opCtx, c.rdb, keys, args...).Result()
		}
	}
	released = err == nil
	written, _ := reply.([]any) // 1 then other fields; a plain 1 when there were none
	switch {
	case err != nil:
		if c.opts.OnWriteFailed != nil {
			c.opts.OnWriteFailed(key, redisfail.Wrap(err))
		}
	case written == nil && reply != int64(1):
		c.staleWrites.Add(1)
		return errOvertaken
	case len(written) > 1 && c.opts.OnOtherFields != nil:
		others := make([]string, 0, len(written)-1)
		for _, f := range written[1:] {
			if s, ok := f.(string); ok && s != field {
				others = append(others, s)
			}
		}
		c.opts.OnOtherFields(key, field, others)
	}
	return nil
}
