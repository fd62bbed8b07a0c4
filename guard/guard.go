// Package guard puts a guard in front of cache-aside reads on Redis: floods
// of unknown IDs never reach the database (penetration), a hot key that
// expires is loaded once across all processes (stampede), and TTLs are spread
// so keys loaded together do not expire together (avalanche).
//
// Open one [Guard] per kind of entity with [New] (give [FilterOptions] an
// ID source, or call [Guard.Rebuild]), read with [Get] or a typed handle
// from [For], and after each committed write call [Set] for an upsert (it
// adds the ID to the filter too), [Guard.Delete] for a delete, or
// [Guard.Invalidate]. A Get takes five steps:
// (1) the ID is checked, (2) with [LocalOptions] memory answers, (3) one
// round trip reads the filter, the value and any "not found" marker, (4) a
// value, a reject or a marker answers, (5) a miss joins the ID's flight,
// which loads under a per-key Redis lock and writes before it answers. When
// Redis cannot answer it loads through; Redis errors wrap [ErrUnavailable].
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/loader"
	"github.com/cacheguard/cacheguard/lock"
)

// New opens a Guard and Close drains it. The files, for a maintainer reading
// top-down: a Get runs through get.go (its steps, and the entry's field and
// frame), read.go (the one round trip, the plan of what it sends, shared by
// concurrent Gets), and on a miss flight.go (one flight per key in
// the process, under the key's lock across processes); health.go decides
// whether Redis answers and what to do when it does not, lost.go and
// replay.go keep writes Redis did not take. Every goroutine belongs to the
// supervisor (supervisor.go), which Close stops.

// Guard guards the reads of one kind of entity. It is safe for concurrent use.
type Guard struct {
	rdb  redis.UniversalClient
	name string
	opts Options // resolved: no zero fields
	keys keyspace.Guard
	log  *slog.Logger

	bound        atomic.Pointer[typeBinding] // the type values decode into, set by the first Get or For
	starts       atomic.Uint64               // counts flights and shared reads as they start (see since)
	rd           reader                      // the read of step 3 (read.go)
	local        *local                      // the in-process cache, or nil
	flights      flightGroup                 // one flight per value key in this process
	coord        *loader.Coordinator         // one load per value key across processes
	bf           filterState                 // the bloom filter, once opened (connect.go)
	outage       *outage                     // what Get does when Redis cannot answer
	stats        counters
	unw          unwritten   // the IDs whose writes failed, until replayed (replay.go)
	marks        *marks      // this Guard's writes in Redis, to notice those Redis lost (lost.go)
	schemaWarned warnedPairs // the pairs of schema versions warned of (otherSchemas)
	tel          *telemetry  // OpenTelemetry instruments, or nil (off)
	sup          *supervisor // every goroutine and flight of the Guard, stopped and waited for by Close
	posSlots     slotMap     // a Cluster's master slots and the position copies last seen (position.go)
	closeOnce    sync.Once
	closeErr     error // set once by Close
}

// New opens the Guard called name (letters, digits, '_', '-', '.') on rdb,
// creating its bloom filter in Redis if needed (a process sized otherwise
// adopts the stored layout and logs it).
//
// New does not need Redis up: if it cannot reach Redis, it returns a working
// Guard that connects by itself when Redis is back (Gets meanwhile follow
// the outage policy, OutageOptions), and logs it. It fails when Redis
// answers with an error that waiting will not mend (an ACL's NOPERM),
// wrapping ErrUnavailable. Close the Guard when done with it.
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
		rdb:  rdb,
		name: name,
		opts: o,
		keys: keyspace.ForGuard(o.KeyPrefix, name, keyspace.MaxKeyLen),
		log:  slog.New(newRateLimited(o.Logger.Handler())).With("guard", name),
	}
	g.marks = newMarks(ctx, rdb)
	g.unw.wake = make(chan struct{}, 1)
	g.bf.copyWake = make(chan struct{}, 1)
	g.sup = newSupervisor(ctx)
	g.rd.batch = batch.New(readsInFlight, readBatchMax, g.runReads, g.sup.spawn)
	g.rd.calls.New = func() any { return new(batch.Call[readReq]) }
	// A new Guard's first reads are likely misses (a cold cache, or a
	// flood of unknown IDs already under way): they send the bloom probe
	// with the HGET until hits have paid the credit back (see read).
	g.rd.credit.Store(missCredit)
	g.rd.shared.InCaller = true // a read is bounded by the client's own timeouts: no goroutine, no timer
	if g.outage, err = newOutage(*o.Outage, g); err != nil {
		return nil, err
	}
	// A flight's life is bounded: see Options.RedisTimeout.
	g.flights.Timeout = o.Tuning.LockWait + o.LoadTimeout + 4*o.Tuning.RedisTimeout
	g.flights.Spawn = g.sup.spawn // the flights' goroutines are the supervisor's
	g.bf.opts = &bloom.Options{
		ExpectedItems: o.Filter.ExpectedItems, FalsePositiveRate: o.Filter.FalsePositiveRate,
		OnSaturated: func(s bloom.Saturation) {
			g.log.Warn("cacheguard: bloom filter saturated; rebuild it with a larger ExpectedItems",
				"added", s.Added, "estimated_fp_rate", s.EstimatedFPRate, "target", s.TargetFPRate)
		},
		OnSwitch: func(int64) { g.wakeCopy() }, // the copy is of the old generation: fetch the new one
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
	g.rd.locks = lock.New(rdb)
	g.coord = loader.NewCoordinator(rdb, g.keys.Loaded(), &loader.CoordinatorOptions{
		LockTTL:    o.Tuning.LockTTL,
		LockWait:   o.Tuning.LockWait,
		LoadOnBusy: o.Tuning.LoadOnBusy,
		OpTimeout:  o.Tuning.RedisTimeout,
		OnLockLost: func(key string, err error) {
			// A write to the source of truth deletes the lock (it voids the
			// load), and so does its lease running out while Redis was
			// unreachable: either way the load's result will not be cached.
			g.log.Warn("cacheguard: load lock lost while loading (a write voided the load, or the lock expired); its result will not be cached",
				"id", g.idOf(key), "key", key, "err", err)
		},
		ReadTTL: g.local != nil, // a flight keeps what its re-check found (see miss.accept)
		Spawn:   g.sup.spawn,
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
		g.sup.stop()
		if errors.Is(err, bloom.ErrInvalid) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		return nil, g.fail(ctx, "open", "", err)
	}
	g.autoRebuild("filter not ready at New") // with an ID source, a filter that is not ready is rebuilt in the background
	g.keepCopy()
	return g, nil
}

// Name returns the Guard's name.
func (g *Guard) Name() string { return g.name }

// bounded is ctx with a deadline at most wait (and RedisTimeout) away: a
// Peek or a write waits no longer for Redis whatever its caller's ctx (an
// HTTP request's has no deadline), so a frozen Redis cannot hold it past
// the bound the Guard's own round trips keep.
func (g *Guard) bounded(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	end := time.Now().Add(min(wait, g.opts.Tuning.RedisTimeout))
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, end)
}

// Logger returns the Guard's logger: Options.Logger with the Guard's name,
// writing each cause at most once per 10 s (with a count of those held
// back). The adapters log through it, so an outage writes a few lines a
// minute whatever the entry point.
func (g *Guard) Logger() *slog.Logger { return g.log }

// Close shuts the Guard: every call that starts afterwards, of every method
// and of Get (values held in process memory included), fails with ErrClosed.
// Close waits for the calls in progress and every goroutine the Guard
// started (flights, refreshes, renewals, replays, rebuilds, lock releases), so that
// their cache writes land before the caller closes the Redis client.
// Closing again returns the first Close's result.
func (g *Guard) Close() error {
	// The supervisor first (the gate, then every goroutine), then the read
	// batcher's alarm (no read waits past the gate), the subscriptions and
	// instruments.
	g.closeOnce.Do(func() {
		g.sup.close()
		g.rd.batch.Stop()
		var errs []error
		if g.local != nil {
			errs = append(errs, g.local.close())
		}
		errs = append(errs, g.coord.Close(), g.tel.close())
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

// errNil is what an entry point returns for a nil Guard or function.
func errNil(what string) error {
	return errors.New("cacheguard: " + what + " needs a non-nil Guard and load function")
}
