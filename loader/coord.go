package loader

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/lock"
)

// ErrBusy: another process held the key's lock for longer than LockWait.
var ErrBusy = errors.New("loader: lock wait exceeded")

// errOvertaken: the holder's write was refused because its lock was no
// longer its own (a write to the source of truth deleted it, or it expired
// and perhaps passed to another holder); Run loads again.
var errOvertaken = errors.New("loader: lock overtaken before the write")

// DefaultLockTTL is the default of CoordinatorOptions.LockTTL, and of the
// guard's Tuning.LockTTL.
const DefaultLockTTL = 5 * time.Second

// defaultLockWait is the default of CoordinatorOptions.LockWait.
const defaultLockWait = 15 * time.Second

var (
	//go:embed lua/write_release.lua
	writeReleaseLua string
	//go:embed lua/release_publish.lua
	releasePublishLua string

	writeRelease   = redis.NewScript(writeReleaseLua)
	releasePublish = redis.NewScript(releasePublishLua)
)

// CoordinatorOptions tunes a Coordinator. A nil pointer means defaults.
type CoordinatorOptions struct {
	// LockTTL is the lease of a key's lock; a watchdog renews it every
	// LockTTL/3 while the load runs, so it only matters when the holder dies:
	// the others take over about LockTTL later. Default DefaultLockTTL.
	LockTTL time.Duration
	// LockWait bounds how long a flight waits for other processes' loads of
	// its key before it gives up with ErrBusy. Default 15 seconds.
	LockWait time.Duration
	// LoadOnBusy makes a flight that waited LockWait load by itself, without
	// writing the result, instead of returning ErrBusy.
	LoadOnBusy bool
	// OpTimeout bounds each Redis round trip of Run (lock attempt and
	// re-check, write, release and publish, the reads of a waiter), so that
	// a stalled Redis cannot keep a flight waiting on it. Default 1 second.
	OpTimeout time.Duration
	// OnLockLost, if set, is told when a holder's watchdog lost its lock.
	OnLockLost func(key string, err error)
	// ReadTTL makes Run's lock attempt read the entry's PTTL behind its
	// re-check, in the same round trip, for an Accept that keeps what it
	// found no longer than Redis does (TryRun's attempt reads none).
	ReadTTL bool
	// Spawn, if set, starts the goroutines of shared round trips, so that
	// their owner waits for them (nil: a plain go statement).
	Spawn func(func())
}

// Fill is the engine's part in a Run: the calls the protocol cannot make
// without it, mid-way. Everything else Run returns or counts (Stats).
type Fill struct {
	// Accept is given what the cache holds under the key; it reports
	// whether that answers the call (false: load it, e.g. because it was
	// corrupt). ttl is the entry's remaining TTL when the holder's re-check
	// read it with the entry (CoordinatorOptions.ReadTTL), else 0.
	Accept func(ctx context.Context, raw []byte, ttl time.Duration) bool
	// Load loads the key's value. What it returns is written under the key
	// for ttl if the holder's lock is still its own. An error is returned
	// by Run as is, and nothing is written.
	Load func(ctx context.Context) (frame []byte, ttl time.Duration, err error)
	// Waiting, if set, is called each time Run finds the key's lock held by
	// another and starts waiting for it (a caller that batches loads learns
	// that this key will not join the batch now).
	Waiting func()
}

// Ran is what a Run or TryRun did besides its answer: its waits for other
// holders' loads, and what its own write met.
type Ran struct {
	Waits    []Wait   // each wait for another holder's load, in order
	WriteErr error    // Redis failed the write (wraps redisfail.ErrUnavailable): the load is served, not cached
	Others   []string // the other fields (schema versions) the write found in the hash
}

// Wait is one wait for another holder's load: when it began and ended,
// and how: "woken" (the holder published), "expired" (its lease ran out
// first), "timeout" (LockWait ran out first) or "cancelled" (ctx ended, or
// Redis failed).
type Wait struct {
	Began, Ended time.Time
	Result       string
}

// Coordinator makes one process at a time load a key, across the processes
// that share a Redis and a channel, and wakes the others. Run, for field F of K:
//
//  1. One round trip: SET NX PX of K's lock (a token unique to the attempt),
//     and behind it an HGET of K's field F: for the winner, the re-check.
//  2. A winner whose re-check found K answers from it; else it loads, under
//     a watchdog that renews the lock every LockTTL/3.
//  3. It writes the frame, releases the lock and, if a flight waits (step 4
//     left K's mark), PUBLISHes K, in one script, only if the lock still holds
//     its token: every write to the source of truth deletes the lock, so an
//     overtaken load is refused and loads again. Otherwise (no load, a failed
//     load) it releases and publishes alone.
//  4. A loser subscribes, leaves K's waiting mark and reads K behind it, then
//     waits for the publish, the holder's lease or LockWait; woken, it reads K
//     and, if it is still empty, goes back to step 1.
type Coordinator struct {
	rdb     redis.UniversalClient
	locks   *lock.Client
	wake    waker
	opts    CoordinatorOptions
	channel string
	trips   *batch.Batcher[queueFunc] // the lock attempts and writes of concurrent flights share round trips (see runTrips)

	waits, timeouts, wakeups, staleWrites atomic.Uint64
}

// NewCoordinator returns a Coordinator that publishes on channel. Close it to
// end its subscription.
func NewCoordinator(rdb redis.UniversalClient, channel string, opts *CoordinatorOptions) *Coordinator {
	var o CoordinatorOptions
	if opts != nil {
		o = *opts
	}
	if o.LockTTL <= 0 {
		o.LockTTL = DefaultLockTTL
	}
	if o.LockWait <= 0 {
		o.LockWait = defaultLockWait
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = time.Second
	}
	c := &Coordinator{
		rdb:     rdb,
		locks:   lock.New(rdb),
		wake:    waker{rdb: rdb, channel: channel},
		opts:    o,
		channel: channel,
	}
	c.trips = batch.New(tripsInFlight, tripBatchMax, c.runTrips, o.Spawn)
	return c
}

// LoadScripts loads the scripts of a holder's write and release into Redis
// (every master of a cluster), so that the first write after a start, or
// after Redis lost its script cache, costs no NOSCRIPT round trip. Run
// sends a script that is missing all the same.
func (c *Coordinator) LoadScripts(ctx context.Context) error {
	for _, s := range []*redis.Script{writeRelease, releasePublish} {
		if err := s.Load(ctx, c.rdb).Err(); err != nil {
			return fmt.Errorf("loader: load scripts: %w", redisfail.Wrap(err))
		}
	}
	return nil
}

// Close ends the Coordinator's subscription. Runs after Close fail.
func (c *Coordinator) Close() error { return c.wake.close() }

// Stats counts a Coordinator's waits and refused writes.
type Stats struct {
	Waits       uint64 // times a flight found the lock held elsewhere and waited
	Timeouts    uint64 // waits that ran past LockWait
	Wakeups     uint64 // waits ended by the holder's publish
	StaleWrites uint64 // writes refused because the holder's lock was no longer its own
}

// Stats returns the Coordinator's counters.
func (c *Coordinator) Stats() Stats {
	return Stats{Waits: c.waits.Load(), Timeouts: c.timeouts.Load(), Wakeups: c.wakeups.Load(), StaleWrites: c.staleWrites.Load()}
}

// Run fills field of key once across processes (see Coordinator for the
// steps). With held, a lock on key the caller took itself in a round trip of
// its own (lock.Client.Queue, with the HGET of field queued behind the
// attempt: the re-check of step 1) that found nothing under field, it
// starts at step 2, the load, under held, whose lease may be shorter than
// LockTTL: the watchdog's first refresh comes within it (see
// lock.Lock.KeepAlive). It returns nil when f answered (from the cache or
// from a load), the load's error, ErrBusy, ctx's error, or a Redis error
// wrapping redisfail.ErrUnavailable; and, whatever the answer, what it did
// on the way (Ran).
func (c *Coordinator) Run(ctx context.Context, key, field string, held *lock.Lock, f Fill) (ran Ran, err error) {
	t := targetOf(key, field)
	if held != nil {
		nothing := redis.NewStringResult("", redis.Nil) // what the caller's re-check found
		if err := c.hold(ctx, held, t, reading{get: nothing}, f, &ran); !errors.Is(err, errOvertaken) {
			return ran, err
		}
	}
	deadline := time.Now().Add(c.opts.LockWait)
	for {
		l, get, lease, err := c.attempt(ctx, t, c.opts.ReadTTL)
		switch {
		case err == nil:
			err = c.hold(ctx, l, t, get, f, &ran)
			if !errors.Is(err, errOvertaken) {
				return ran, err
			}
			if !time.Now().Before(deadline) {
				return ran, nil // invalidated again and again: serve the last load, uncached
			}
			continue // overtaken by an invalidation: load again, under a new lock
		case !errors.Is(err, lock.ErrNotObtained):
			return ran, err
		}
		if done, err := c.cached(ctx, get, f); done || err != nil {
			return ran, err // filled meanwhile by the holder
		}
		c.waits.Add(1)
		if f.Waiting != nil {
			f.Waiting()
		}
		began := time.Now()
		done, result, err := c.wait(ctx, t, lease, deadline, f)
		ran.Waits = append(ran.Waits, Wait{Began: began, Ended: time.Now(), Result: result})
		if done || err != nil {
			return ran, err
		}
		if !time.Now().Before(deadline) {
			c.timeouts.Add(1)
			if c.opts.LoadOnBusy {
				_, _, err := f.Load(ctx)
				return ran, err
			}
			return ran, ErrBusy
		}
	}
}

// Release gives back key's lock l without a write (step 4), and PUBLISHes
// key if a flight in some process waits for it, in one script
// (release_publish.lua), bounded by OpTimeout: for a holder that did not
// get as far as the write, and for a caller that took the lock and did not
// use it (its re-check found the entry, or a flight of its process was
// filling key already). A lock that is no longer l (its lease ran out) is
// left alone.
func (c *Coordinator) Release(ctx context.Context, l *lock.Lock, key string) error {
	return c.release(ctx, l, targetOf(key, ""))
}

func (c *Coordinator) release(ctx context.Context, l *lock.Lock, t target) error {
	opCtx, cancel := c.op(ctx)
	defer cancel()
	err := releasePublish.Run(opCtx, c.rdb, []string{t.lock, t.waiting}, l.Token(), c.channel, t.key).Err()
	if err != nil {
		return fmt.Errorf("loader: release %s: %w", t.key, redisfail.Wrap(err))
	}
	return nil
}

// target is what one Run or TryRun works on: the value key, the field it
// fills, and the key's lock and waiting mark, named once (internal/keyspace).
type target struct {
	key, field    string
	lock, waiting string
}

func targetOf(key, field string) target {
	return target{key: key, field: field, lock: keyspace.Lock(key), waiting: keyspace.Waiting(key)}
}

// TryRun is Run for a refresh ahead of expiry: one attempt on the lock and
// no wait. If another holder has the lock (it is filling key already), or a
// write to the source of truth overtook the load (its lock is gone: the
// entry was invalidated or replaced), TryRun returns nil having written
// nothing. Ran says what its write met.
func (c *Coordinator) TryRun(ctx context.Context, key, field string, f Fill) (ran Ran, err error) {
	t := targetOf(key, field)
	l, get, _, err := c.attempt(ctx, t, false)
	switch {
	case errors.Is(err, lock.ErrNotObtained):
		return ran, nil
	case err != nil:
		return ran, err
	}
	if err := c.hold(ctx, l, t, get, f, &ran); !errors.Is(err, errOvertaken) {
		return ran, err
	}
	return ran, nil
}

// attempt is step 1: the lock attempt with the lock's PTTL and the HGET
// queued behind it, in one round trip (and the key's PTTL behind that
// withTTL). When another holder has the lock (lock.ErrNotObtained), lease
// is what is left of its lease.
func (c *Coordinator) attempt(ctx context.Context, t target, withTTL bool) (l *lock.Lock, get reading, lease time.Duration, err error) {
	opCtx, cancel := c.op(ctx)
	defer cancel()
	// The closure writes only these locals: after a failed send it may
	// still run, into variables nobody reads (not the results).
	var q *lock.Queued
	var qerr error
	var lockTTL *redis.DurationCmd
	var r reading
	if err := c.send(opCtx, func(ctx context.Context, pipe redis.Pipeliner) {
		q, qerr = c.locks.Queue(ctx, pipe, t.lock, c.opts.LockTTL)
		if qerr == nil {
			lockTTL = pipe.PTTL(ctx, t.lock) // the holder's lease, if the attempt fails
		}
		r.get = pipe.HGet(ctx, t.key, t.field)
		if withTTL {
			r.pttl = pipe.PTTL(ctx, t.key)
		}
	}); err != nil {
		return nil, reading{}, 0, err
	}
	get = r
	if qerr != nil {
		return nil, reading{}, 0, qerr
	}
	// The attempt is a plain SET NX in the pipeline: the HGET behind it ran
	// after it, so for the winner it is the re-check (lock.TestQueue).
	l, err = q.Result(opCtx)
	switch {
	case err == nil:
		return l, get, 0, nil
	case errors.Is(err, lock.ErrNotObtained):
		// -2: the holder's lock expired between the two commands
		return nil, get, max(lockTTL.Val(), 0), err
	}
	return nil, reading{}, 0, err
}

// op bounds one Redis round trip by OpTimeout.
func (c *Coordinator) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.OpTimeout)
}

// reading is a read of a key's field, with the key's PTTL when the attempt
// asked for it (pttl nil: not asked).
type reading struct {
	get  *redis.StringCmd
	pttl *redis.DurationCmd
}

// cached reads a reading's reply: done when f accepts what the cache holds,
// given with the entry's TTL when the reading carries one.
func (c *Coordinator) cached(ctx context.Context, r reading, f Fill) (done bool, err error) {
	raw, err := r.get.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return true, fmt.Errorf("loader: read: %w", redisfail.Wrap(err))
	}
	var ttl time.Duration
	if r.pttl != nil {
		if d, err := r.pttl.Result(); err == nil && d > 0 {
			ttl = d
		}
	}
	return f.Accept(ctx, raw, ttl), nil
}

// hold runs steps 2 to 4 with the lock held: the re-check's answer, the load,
// and the write with the release and publish, or the release and publish
// alone when it did not get that far (also when the load panics). It
// returns errOvertaken when the write was refused, and records in ran what
// the write met.
func (c *Coordinator) hold(ctx context.Context, l *lock.Lock, t target, get reading, f Fill, ran *Ran) error {
	stop := l.KeepAlive(ctx, c.opts.LockTTL, func(err error) {
		if c.opts.OnLockLost != nil {
			c.opts.OnLockLost(t.key, err)
		}
	})
	released := false
	defer func() {
		stop()
		if released {
			return
		}
		_ = c.release(context.WithoutCancel(ctx), l, t)
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
	keys := []string{t.key, t.lock, t.waiting}
	args := []any{t.field, frame, max(ttl.Milliseconds(), 1), l.Token(), c.channel, keyspace.Filled}
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
		ran.WriteErr = redisfail.Wrap(err)
	case written == nil && reply != int64(1):
		c.staleWrites.Add(1)
		return errOvertaken
	case len(written) > 1:
		for _, f := range written[1:] {
			if s, ok := f.(string); ok && s != t.field {
				ran.Others = append(ran.Others, s)
			}
		}
	}
	return nil
}

// Trip batching. The lock attempts (with their re-checks) and the
// writes of concurrent flights go through a group commit (package batch):
// while tripsInFlight of those round trips are under way, the next ones
// wait and go together in one pipeline. Each stays its own commands, so
// the protocol is unchanged; what falls is the system calls and Redis
// event-loop turns per miss when many keys miss at once (a cold cache).
const (
	tripsInFlight = 2
	tripBatchMax  = 128
)

// queueFunc is one flight's part of a round trip: it adds its commands to
// the pipeline and keeps them to read after it ran.
type queueFunc func(ctx context.Context, pipe redis.Pipeliner)

// runTrips sends calls' commands in one pipeline. One carrying other
// flights' commands runs on the leading flight's ctx without its
// cancellation (they wait for it), bounded by OpTimeout.
func (c *Coordinator) runTrips(ctx context.Context, calls []*batch.Call[queueFunc]) {
	if len(calls) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = c.op(ctx)
		defer cancel()
	}
	pipe := c.rdb.Pipeline()
	for _, call := range calls {
		call.Req(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
}

// send runs queue's commands in a round trip, perhaps shared with other
// flights'. If ctx ends first it returns the error wrapping
// redisfail.ErrUnavailable, and queue's commands may still be sent later:
// the caller must not read what queue keeps then (the scripts are safe to
// run late: a write whose lock is gone is refused, a release checks
// its token).
func (c *Coordinator) send(ctx context.Context, queue queueFunc) error {
	call := &batch.Call[queueFunc]{Req: queue}
	if err := c.trips.Do(ctx, call); err != nil {
		return redisfail.Wrap(err)
	}
	return nil
}
