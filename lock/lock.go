// Package lock is a Redis lock with a token and a watchdog, usable without
// the rest of cacheguard.
//
// [Client.Obtain] sets the lock key to a token unique to the attempt (SET NX
// PX), retrying as [Options] say. [Lock.Release] and [Lock.Refresh] act only
// while the key still holds that token (compare-and-act scripts), so a
// holder whose lock expired can never free or extend the next holder's lock;
// [Lock.KeepAlive] renews it while the holder works. A lock protects nothing
// once it has expired: make the holder's write check [Lock.Token] against
// the lock key in the same script, as cacheguard's own writes do. Give the
// key a hash tag to keep it in the slot of what it guards on a cluster.
// Redis failures wrap ErrUnavailable.
package lock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redislock"
)

var (
	// ErrNotObtained: another holder has the lock (and Options.Wait ran out).
	ErrNotObtained = redislock.ErrNotObtained
	// ErrNotHeld: the lock expired or belongs to another holder.
	ErrNotHeld = redislock.ErrNotHeld
	// ErrInvalid reports a bad key or TTL.
	ErrInvalid = redislock.ErrInvalid
	// ErrUnavailable is wrapped by every error that Redis failing to answer
	// causes (the value of guard.ErrUnavailable).
	ErrUnavailable = redislock.ErrUnavailable
)

// Client obtains locks. It is safe for concurrent use.
type Client struct{ c *redislock.Client }

// New returns a Client on rdb (standalone, Sentinel or Cluster).
func New(rdb redis.UniversalClient) *Client { return &Client{c: redislock.New(rdb)} }

// Options tunes Obtain. A nil *Options means one attempt.
type Options struct {
	// Wait is how long Obtain keeps trying while another holder has the
	// lock. 0: a single attempt. Retries stop early when ctx is done.
	Wait time.Duration
	// MinBackoff and MaxBackoff bound the pause between attempts: from
	// MinBackoff (default 4ms), doubling up to MaxBackoff (default 256ms),
	// with full jitter, and never past the holder's remaining lease.
	MinBackoff, MaxBackoff time.Duration
}

// Obtain takes the lock key for ttl, retrying as opts say. It returns an
// error wrapping ErrNotObtained when another holder keeps it.
func (c *Client) Obtain(ctx context.Context, key string, ttl time.Duration, opts *Options) (*Lock, error) {
	var o *redislock.Options
	if opts != nil {
		o = &redislock.Options{Wait: opts.Wait, MinBackoff: opts.MinBackoff, MaxBackoff: opts.MaxBackoff}
	}
	l, err := c.c.Obtain(ctx, key, ttl, o)
	if err != nil {
		return nil, err
	}
	return &Lock{l: l}, nil
}

// Lock is an obtained lock.
type Lock struct{ l *redislock.Lock }

// Token returns the lock's token, unique to this lock.
func (l *Lock) Token() string { return l.l.Token() }

// Release frees the lock; ErrNotHeld if it had expired or was taken over.
func (l *Lock) Release(ctx context.Context) error { return l.l.Release(ctx) }

// Refresh sets the lock's TTL to ttl; ErrNotHeld if it had expired or was
// taken over.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error { return l.l.Refresh(ctx, ttl) }

// KeepAlive starts a watchdog that refreshes the lock to ttl every ttl/3
// until stop is called (stop waits for it) or ctx is done. If the lock is
// lost (gone, or refreshes failed until it must have expired), it calls
// onLost once (if non-nil) and stops. A hold shorter than ttl/3 costs no
// goroutine and no command.
func (l *Lock) KeepAlive(ctx context.Context, ttl time.Duration, onLost func(error)) (stop func()) {
	return l.l.KeepAlive(ctx, ttl, onLost)
}
