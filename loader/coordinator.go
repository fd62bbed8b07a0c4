package loader

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/lock"
)

var (
	// ErrBusy: another process held the key's lock for longer than LockWait.
	ErrBusy = errors.New("loader: lock wait exceeded")
	// ErrFenceLost is what a load callback returns when its fenced write was
	// refused because a newer fence exists (an invalidation, or the lock
	// expired and another holder took over). Run then loads again.
	ErrFenceLost = errors.New("loader: fence superseded")
)

// CoordinatorOptions tunes a Coordinator. A nil pointer means defaults.
type CoordinatorOptions struct {
	// LockTTL is the lease of a key's lock; a watchdog renews it every
	// LockTTL/3 while the load runs, so it only matters when the holder dies:
	// the others take over about LockTTL later. Default 5 seconds.
	LockTTL time.Duration
	// LockWait bounds how long a flight waits for other processes' loads of
	// its key before it gives up with ErrBusy. Default 15 seconds.
	LockWait time.Duration
	// LoadOnBusy makes a flight that waited LockWait load by itself (with
	// fence 0: the load callback must not write) instead of ErrBusy.
	LoadOnBusy bool
	// FenceTTL is the lifetime of a key's fence; see lock.Options.
	// Default 24 hours.
	FenceTTL time.Duration
	// OnLockLost, if set, is told when a holder's watchdog lost its lock.
	OnLockLost func(key string, err error)
}

// Coordinator makes one process at a time load a key, across all processes
// that share a Redis and a channel name, and wakes the others when it is done.
//
// Run tries the key's lock ("<key>:lock", fence "<key>:fence": give key a hash
// tag on Redis Cluster). The holder checks the cache again (another process
// may have filled it between the caller's read and the lock), runs the load
// with the lock's fencing number under a watchdog, releases the lock and
// PUBLISHes the key. The others subscribe (one subscription per Coordinator,
// fanned out in-process), check the cache once subscribed so that a publish
// cannot slip between the check and the wait, and wait for the publish, the
// holder's lease to run out, or LockWait. Woken, they check the cache; if the
// holder failed or died they try the lock themselves.
type Coordinator struct {
	locks *lock.Client
	wake  waker
	opts  CoordinatorOptions

	waits, timeouts, wakeups atomic.Uint64
}

// NewCoordinator returns a Coordinator that publishes on channel. Close it to
// end its subscription.
func NewCoordinator(rdb redis.UniversalClient, channel string, opts *CoordinatorOptions) *Coordinator {
	var o CoordinatorOptions
	if opts != nil {
		o = *opts
	}
	if o.LockTTL <= 0 {
		o.LockTTL = 5 * time.Second
	}
	if o.LockWait <= 0 {
		o.LockWait = 15 * time.Second
	}
	if o.FenceTTL <= 0 {
		o.FenceTTL = 24 * time.Hour
	}
	return &Coordinator{
		locks: lock.New(rdb),
		wake:  waker{rdb: rdb, channel: channel},
		opts:  o,
	}
}

// Close ends the Coordinator's subscription. Runs after Close fail.
func (c *Coordinator) Close() error { return c.wake.close() }

// CoordinatorStats counts a Coordinator's waits.
type CoordinatorStats struct {
	Waits    uint64 // times a flight found the lock held elsewhere and waited
	Timeouts uint64 // waits that ran past LockWait
	Wakeups  uint64 // waits ended by the holder's publish
}

// Stats returns the Coordinator's counters.
func (c *Coordinator) Stats() CoordinatorStats {
	return CoordinatorStats{Waits: c.waits.Load(), Timeouts: c.timeouts.Load(), Wakeups: c.wakeups.Load()}
}

// Run fills key once across processes. check reports whether the cache now
// answers (done) and with what error; load runs with the lock held and its
// fencing number, and returns ErrFenceLost if its write was refused. Run
// returns the error of the check or load that finished the job, ErrBusy, or
// a Redis error.
func (c *Coordinator) Run(ctx context.Context, key string,
	check func(ctx context.Context) (done bool, err error),
	load func(ctx context.Context, fence int64) error,
) error {
	deadline := time.Now().Add(c.opts.LockWait)
	for {
		l, err := c.locks.Obtain(ctx, key+":lock", c.opts.LockTTL,
			&lock.Options{FenceKey: key + ":fence", FenceTTL: c.opts.FenceTTL})
		if err == nil {
			err = c.hold(ctx, l, key, check, load)
			if errors.Is(err, ErrFenceLost) && time.Now().Before(deadline) {
				continue // overtaken by an invalidation: load again, newer fence
			}
			return err
		}
		var held *lock.HeldError
		if !errors.As(err, &held) {
			return err
		}
		c.waits.Add(1)
		done, err := c.wait(ctx, key, held.TTL, deadline, check)
		if done {
			return err
		}
		if !time.Now().Before(deadline) {
			c.timeouts.Add(1)
			if c.opts.LoadOnBusy {
				return load(ctx, 0)
			}
			return ErrBusy
		}
	}
}

// hold runs check and load with the lock held, then releases the lock and
// publishes the key, also when load panics.
func (c *Coordinator) hold(ctx context.Context, l *lock.Lock, key string,
	check func(context.Context) (bool, error), load func(context.Context, int64) error,
) error {
	stop := l.KeepAlive(ctx, c.opts.LockTTL, func(err error) {
		if c.opts.OnLockLost != nil {
			c.opts.OnLockLost(key, err)
		}
	})
	defer func() {
		stop()
		// Release first, then publish: a woken waiter that finds no value
		// can take the lock at once.
		_ = l.Release(context.WithoutCancel(ctx))
		_ = c.wake.publish(context.WithoutCancel(ctx), key)
	}()
	if done, err := check(ctx); done || err != nil {
		return err
	}
	return load(ctx, l.Fence())
}

// wait blocks until the holder publishes key, its lease (holderTTL) runs out,
// or the deadline passes. done reports that check answered.
func (c *Coordinator) wait(ctx context.Context, key string, holderTTL time.Duration, deadline time.Time,
	check func(context.Context) (bool, error),
) (done bool, err error) {
	woken, cancel, err := c.wake.register(ctx, key)
	if err != nil {
		return true, err
	}
	defer cancel()
	// Subscribed: a publish from now on reaches us, so check before waiting.
	if done, err := check(ctx); done || err != nil {
		return true, err
	}
	t := time.NewTimer(max(min(holderTTL+5*time.Millisecond, time.Until(deadline)), 0))
	defer t.Stop()
	select {
	case <-woken:
		c.wakeups.Add(1)
	case <-t.C:
	case <-ctx.Done():
		return true, ctx.Err()
	}
	if done, err := check(ctx); done || err != nil {
		return true, err
	}
	return false, nil
}
