// Package guard puts a guard in front of cache-aside reads on Redis: floods
// of unknown IDs never reach the database (penetration), a hot key that
// expires is loaded once across all processes (stampede), and TTLs are spread
// so keys loaded together do not expire together (avalanche).
//
// Open one [Guard] per kind of entity with [New], fill its bloom filter with
// [Guard.Rebuild], read with [Get] (or a typed handle from [For]), and after
// each committed write to the database call [Guard.Add], [Set],
// [Guard.Invalidate] or [Guard.Delete]. A Get checks the ID (get.go), reads
// the filter, the value and any "not found" marker in one round trip
// (read.go), and on a miss joins the ID's flight (fill.go), which loads under
// a per-key Redis lock (package loader) and writes before it answers. When
// Redis cannot answer, a Get loads through (outage.go). docs/design.md walks
// one Get through the files; every error Redis causes wraps [ErrUnavailable].
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/coord"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redislock"
	"github.com/cacheguard/cacheguard/loader"
)

// Guard guards the reads of one kind of entity. It is safe for concurrent use.
type Guard struct {
	rdb       redis.UniversalClient
	name      string
	opts      Options // resolved: no zero fields
	keys      keyspace.Guard
	field     string                       // the value hash's field of this Guard's schema version (Options.Version)
	fieldArg  any                          // field, boxed once for the hit's HGET (read)
	bloom     atomic.Pointer[bloom.Filter] // nil until opened (New while Redis was down); see filter
	bloomOpts *bloom.Options
	outage    *outage // what Get does when Redis cannot answer
	log       *slog.Logger

	local     *local                  // the in-process cache, or nil
	reads     readGroup               // with local: one Redis read per value key at a time (see readShared)
	readBatch *batch.Batcher[readReq] // every Get's read goes through it: concurrent reads share round trips (see runReads)
	readCalls sync.Pool               // of *batch.Call[readReq], reused by read
	flights   loader.Group[flight]    // one flight per value key in this process
	pending   pending                 // the fill flights under way (Flush)
	coord     *coord.Coordinator      // one load per value key across processes
	stats     counters
	bypassing atomic.Bool                 // the filter answered ErrNotReady last time (logged once per episode)
	gate      gate                        // every entry point passes it; Close shuts it
	bound     atomic.Pointer[typeBinding] // the type values decode into, set by the first Get or For
	credit    atomic.Int64                // > 0: recent reads missed: send the bloom probe with the HGET (see read)
	locks     *redislock.Client           // the locks reads take (see lockWithRead)
	lockBias  atomic.Int64                // > 0: reads that found nothing mostly loaded, and reads' locks were mostly used (see Lock bias)
	seen      atomic.Pointer[seenTable]   // the IDs read lately, once a miss opened the gate (see lockWithRead)
	starts    atomic.Uint64               // counts flights and shared reads as they start; a Get reads it as it starts (see since)
	tel       *telemetry                  // OpenTelemetry instruments, or nil (off)

	// Background work (automatic rebuilds, connecting after a New without
	// Redis): each runs in a goroutine owned by the Guard, tracked by
	// background; Close closes closing, which ends them, and waits.
	lastRebuild    atomic.Int64 // unix nanos of the last automatic attempt
	lastSlotReload atomic.Int64 // unix nanos of the last cluster slot-map reload we asked for
	background     sync.WaitGroup
	closing        chan struct{}
	life           context.Context    // background work's context: cancelled by Close
	endLife        context.CancelFunc // cancels life
	refreshing     sync.Map           // value key → struct{}: the refreshes ahead running in this process
	closeOnce      sync.Once
	closeErr       error // set once by Close
}

// New opens the Guard called name (letters, digits, '_', '-', '.') on rdb,
// creating its bloom filter in Redis if needed (a process sized otherwise
// adopts the stored layout and logs it).
//
// New does not need Redis up: if it cannot reach Redis, it returns a working
// Guard that connects by itself when Redis is back (Gets meanwhile follow
// the outage policy, OutageOptions), and logs it. It fails when Redis
// answers with an error that waiting will not mend (an ACL's NOPERM),
// wrapping ErrUnavailable.
// Close the Guard when done with it: it may hold a pub/sub subscription and
// a goroutine.
func New(ctx context.Context, rdb redis.UniversalClient, name string, opts *Options) (*Guard, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOptions)
	}
	if !keyspace.ValidName(name) {
		return nil, fmt.Errorf("%w: name %q (want 1-64 of [A-Za-z0-9_.-])", ErrInvalidOptions, name)
	}
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	g := &Guard{
		rdb:   rdb,
		name:  name,
		opts:  o,
		keys:  keyspace.ForGuard(o.KeyPrefix, name, o.Tuning.MaxKeyLen),
		field: o.Version, fieldArg: o.Version,
		log: o.Logger.With("guard", name),

		closing: make(chan struct{}),
	}
	g.life, g.endLife = context.WithCancel(context.Background())
	g.readBatch = batch.New(o.Tuning.ReadsInFlight, readBatchMax, g.runReads)
	if o.Tuning.ReadsInFlight < 0 { // off: every read alone, at once
		g.readBatch = batch.New(math.MaxInt, 1, g.runReads)
	}
	g.readCalls.New = func() any { return new(batch.Call[readReq]) }
	g.gate.drained, g.gate.left = make(chan struct{}), make(chan struct{}, 1)
	// A new Guard's first reads are likely misses (a cold cache, or a
	// flood of unknown IDs already under way): they send the bloom probe
	// with the HGET until hits have paid the credit back (see read).
	g.credit.Store(missCredit)
	if g.outage, err = newOutage(*o.Outage, g); err != nil {
		return nil, err
	}
	// A flight's life is bounded: see Options.RedisTimeout.
	g.flights.Timeout = o.Tuning.LockWait + o.LoadTimeout + 4*o.Tuning.RedisTimeout
	g.bloomOpts = &bloom.Options{
		ExpectedItems: o.Filter.ExpectedItems, FalsePositiveRate: o.Filter.FalsePositiveRate,
		OnSaturated: func(s bloom.Saturation) {
			g.log.Warn("cacheguard: bloom filter saturated; rebuild it with a larger ExpectedItems",
				"added", s.Added, "estimated_fp_rate", s.EstimatedFPRate, "target", s.TargetFPRate)
		},
	}
	if g.tel, err = newTelemetry(g, o.Telemetry.TracerProvider, o.Telemetry.MeterProvider); err != nil {
		return nil, fmt.Errorf("%w: opentelemetry: %w", ErrInvalidOptions, err)
	}
	if o.Local != nil {
		if g.local, err = newLocal(*o.Local, g.keys.ID); err != nil {
			_ = g.tel.close()
			return nil, err
		}
	}
	g.locks = redislock.New(rdb)
	g.coord = coord.New(rdb, g.keys.Loaded(), &coord.Options{
		LockTTL:    o.Tuning.LockTTL,
		LockWait:   o.Tuning.LockWait,
		LoadOnBusy: o.Tuning.LoadOnBusy,
		OpTimeout:  o.Tuning.RedisTimeout,
		OnLockLost: func(key string, err error) {
			// A write to the source of truth deletes the lock (it voids the
			// load), and so does its lease running out while Redis was
			// unreachable: either way the load's result will not be cached.
			g.log.Warn("cacheguard: load lock lost while loading (a write voided the load, or the lock expired); its result will not be cached", "key", key, "err", err)
		},
		OnWriteFailed: func(key string, err error) {
			// The load's result is good and served; only caching it failed.
			_ = g.fail(context.Background(), "write", key, err)
		},
	})
	g.checkClient(ctx)
	switch err := g.connect(ctx); {
	case err == nil:
	case errors.Is(err, ErrUnavailable) && !reply(err):
		// Down, not refusing: work without it, connect when it is back.
		g.log.WarnContext(ctx, "cacheguard: redis unavailable at New; serving through the outage policy until it is back", "err", err)
		g.connectLater()
	default:
		if g.local != nil {
			_ = g.local.close() // what connect may have started
		}
		_ = g.tel.close()
		_ = g.coord.Close()
		g.endLife()
		if errors.Is(err, bloom.ErrInvalid) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		return nil, g.fail(ctx, "open", "", err)
	}
	return g, nil
}

// Name returns the Guard's name.
func (g *Guard) Name() string { return g.name }

// Close shuts the Guard: every call that starts afterwards, of every method
// and of Get (values held in process memory included), fails with ErrClosed.
// Close waits for the calls in progress and the flights they started (each
// bounded by LoadTimeout and LockWait), so that their cache writes land
// before the caller closes the Redis client; then it cancels any background
// rebuild and ends the Guard's pub/sub subscriptions. Closing again returns
// the first Close's result.
func (g *Guard) Close() error {
	g.closeOnce.Do(func() {
		g.gate.close()
		close(g.closing)
		g.endLife()
		g.background.Wait()
		var errs []error
		if g.local != nil {
			errs = append(errs, g.local.close())
		}
		errs = append(errs, g.coord.Close(), g.tel.close())
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

// gate lets calls in until it is closed, then waits for those inside. Every
// exported entry point and every flight passes it (enter, then leave with
// the pass enter gave). Calls inside are counted on stripes, one cache line
// each, picked at random per call: one atomic add on the way in and one on
// the way out, on a line that two cores rarely share (a single counter was
// the most contended word of a local hit). A call leaves on the stripe it
// entered, so no stripe goes negative and a stripe's count is exact.
//
// Close sets closed, then sums the stripes until they read zero, woken by
// each leave that sees closed. A call that entered before closed was set is
// seen by that sum (its add precedes its read of closed, which precedes the
// store, which precedes the sum's read); a call that enters after sees
// closed and leaves at once.
type gate struct {
	inside  stripes // calls inside, each counted on the stripe it entered on
	closed  atomic.Bool
	left    chan struct{} // made by New, buffer 1: a call left after closed was set
	once    sync.Once     // closes drained
	drained chan struct{} // made by New; closed once the gate is closed and empty
}

// gatePass is the stripe a call entered on.
type gatePass uint32

// enter lets a call in, or reports ErrClosed. A call let in must leave with
// the pass.
func (gt *gate) enter() (gatePass, error) {
	p := gatePass(gt.inside.pick())
	gt.inside.add(int(p), 1)
	if gt.closed.Load() {
		gt.leave(p)
		return 0, ErrClosed
	}
	return p, nil
}

func (gt *gate) leave(p gatePass) {
	gt.inside.add(int(p), -1)
	if gt.closed.Load() {
		select {
		case gt.left <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// close refuses new calls and waits for the calls inside to leave. Several
// callers may close; all return once the gate is empty.
func (gt *gate) close() {
	gt.closed.Store(true)
	gt.once.Do(func() {
		for gt.inside.sum() != 0 {
			<-gt.left
		}
		close(gt.drained)
	})
	<-gt.drained
}
