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
// Run sends one round trip with an attempt on the key's lock ("<key>:lock",
// fence "<key>:fence": give key a hash tag on Redis Cluster) and, queued after
// it, the caller's read of the cache: for the holder that read is the re-check
// with the lock taken (another process may have filled the cache between the
// caller's first read and the lock). The holder runs the load with the lock's
// fencing number under a watchdog, then releases the lock and PUBLISHes the
// key in one script. The others subscribe (one subscription per Coordinator,
// fanned out in-process), read the cache once subscribed so that a publish
// cannot slip between the read and the wait, and wait for the publish, the
// holder's lease to run out, or LockWait. Woken, they read the cache; if the
// holder failed or died they try the lock themselves. A miss thus costs the
// holder three round trips besides its first read: lock and re-check, its
// write, release and publish.
type Coordinator struct {
	rdb   redis.UniversalClient
	locks *lock.Client
	wake  waker
	opts  CoordinatorOptions

	waits, timeouts, wakeups atomic.Uint64
}

// Check queues a read of the cache into pipe and returns a function that,
// after the pipeline ran, reports whether the cache answers (done) and with
// what error.
type Check func(ctx context.Context, pipe redis.Pipeliner) (answer func() (done bool, err error))

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
		rdb:   rdb,
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

// Run fills key once across processes. check reads the cache; load runs with
// the lock held and its fencing number, and returns ErrFenceLost if its write
// was refused. Run returns the error of the check or load that finished the
// job, ErrBusy, or a Redis error.
func (c *Coordinator) Run(ctx context.Context, key string, check Check, load func(ctx context.Context, fence int64) error) error {
	deadline := time.Now().Add(c.opts.LockWait)
	lockOpts := &lock.Options{FenceKey: key + ":fence", FenceTTL: c.opts.FenceTTL}
	for {
		pipe := c.rdb.Pipeline()
		q, err := c.locks.Queue(ctx, pipe, key+":lock", c.opts.LockTTL, lockOpts)
		if err != nil {
			return err
		}
		answer := check(ctx, pipe)
		_, _ = pipe.Exec(ctx) // errors are read per command
		l, err := q.Result(ctx)
		var held *lock.HeldError
		switch {
		case err == nil:
			if !q.InPipeline() { // the read ran before the lock was taken
				answer = c.checkNow(ctx, check)
			}
			err = c.hold(ctx, l, key, answer, load)
			if errors.Is(err, ErrFenceLost) && time.Now().Before(deadline) {
				continue // overtaken by an invalidation: load again, newer fence
			}
			return err
		case !errors.As(err, &held):
			return err
		}
		if done, err := answer(); done || err != nil {
			return err // filled meanwhile by the holder
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

// checkNow runs check in a round trip of its own.
func (c *Coordinator) checkNow(ctx context.Context, check Check) func() (bool, error) {
	pipe := c.rdb.Pipeline()
	answer := check(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	return answer
}

// hold reads the re-check's answer and runs load with the lock held, then
// releases the lock and publishes the key, also when load panics.
func (c *Coordinator) hold(ctx context.Context, l *lock.Lock, key string,
	answer func() (bool, error), load func(context.Context, int64) error,
) error {
	stop := l.KeepAlive(ctx, c.opts.LockTTL, func(err error) {
		if c.opts.OnLockLost != nil {
			c.opts.OnLockLost(key, err)
		}
	})
	defer func() {
		stop()
		// One script: release first, then publish, so that a woken waiter
		// that finds no value can take the lock at once.
		_ = l.ReleaseAndPublish(context.WithoutCancel(ctx), c.wake.channel, key)
	}()
	if done, err := answer(); done || err != nil {
		return err
	}
	return load(ctx, l.Fence())
}

// wait blocks until the holder publishes key, its lease (holderTTL) runs out,
// or the deadline passes. done reports that check answered.
func (c *Coordinator) wait(ctx context.Context, key string, holderTTL time.Duration, deadline time.Time, check Check) (done bool, err error) {
	woken, cancel, err := c.wake.register(ctx, key)
	if err != nil {
		return true, err
	}
	defer cancel()
	// Subscribed: a publish from now on reaches us, so check before waiting.
	if done, err := c.checkNow(ctx, check)(); done || err != nil {
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
	if done, err := c.checkNow(ctx, check)(); done || err != nil {
		return true, err
	}
	return false, nil
}
