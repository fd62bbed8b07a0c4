package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"unsafe"
)

// Stats are a Guard's counters since New. The first group counts Get calls by
// how they ended (each caller once, even when callers shared a flight); the
// second counts operations.
type Stats struct {
	Hits         uint64 // answered from a value cached in Redis
	LocalHits    uint64 // answered from process memory (Options.Local)
	EmptyHits    uint64 // answered ErrNotFound from a cached empty marker
	BloomRejects uint64 // answered ErrNotFound by the bloom filter
	Misses       uint64 // answered by a load (value or not found)
	Coalesced    uint64 // calls that joined another caller's flight

	Loads         uint64 // IDs loaded: each ID asked of a load function (a GetMany batch counts each of its IDs)
	LoadErrors    uint64 // IDs whose load failed (other than ErrNotFound; a panic counts)
	RedisErrors   uint64 // failed Redis reads and writes
	CorruptValues uint64 // cached entries that did not decode and were dropped
	SchemaMisses  uint64 // loads whose ID held entries of other schemas only (another type shape or Version), never decoded
	BloomBypasses uint64 // probes that found the filter not ready (failed open)
	StaleWrites   uint64 // cache writes refused because an Invalidate overtook the load
	LockWaits     uint64 // flights that found another process loading and waited
	LockTimeouts  uint64 // waits that ran past LockWait (ErrBusy or LoadOnBusy)
	Wakeups       uint64 // waits ended by the loading process's publish

	// The outage policy (OutageOptions).
	LoadThroughs   uint64 // IDs loaded without Redis, their values uncached
	Shed           uint64 // load-throughs refused by the MaxLoads cap (ErrUnavailable)
	Unconfirmed    uint64 // answered ErrUnconfirmed: absent from the filter's copy while Redis or the filter could not answer
	BreakerOpens   uint64 // times the Redis circuit breaker opened
	AbandonedLoads uint64 // loads that did not return within LoadTimeout (their late result dropped)
	Refreshes      uint64 // refreshes ahead of expiry started (RefreshAhead)
	Unwritten      uint64 // IDs whose write failed and waits for its replay (a gauge; +1 while overflowed)
	WritesLost     uint64 // acknowledged writes Redis lost (a restart from an older dump, a lagging replica promoted), replayed; +1 for an overflow
	// FilterCopy is the size in bytes of the filter's copy in process
	// memory (a gauge; 0: none yet, or FilterOptions.NoLocalCopy).
	FilterCopy uint64

	// FilterNotReady: the filter's last probe found it not ready (never
	// built, or lost by Redis), so Gets fail open until it is rebuilt.
	FilterNotReady bool
}

// outcome is how a flight ended, counted once per caller.
type outcome uint8

const (
	outHit outcome = iota + 1
	outEmpty
	outRejected
	outLoaded
	outFailed
	outLocalHit // answered from process memory (Options.Local); never a flight's
)

// counters is the live form of Stats; every field is updated atomically.
// The outcomes every hit or reject counts are striped (see stripes); the
// rest are rare.
type counters struct {
	hits, empty, rejects, localHits                   stripes
	misses, coalesced                                 atomic.Uint64
	loads, loadErrors, redisErrors, corrupt, bypasses atomic.Uint64
	loadThroughs, shed, breakerOpens, abandonedLoads  atomic.Uint64
	refreshes, schemaMisses, writesLost, unconfirmed  atomic.Uint64
}

func (c *counters) count(o outcome, coalesced bool) {
	switch o {
	case outHit:
		c.hits.inc()
	case outEmpty:
		c.empty.inc()
	case outRejected:
		c.rejects.inc()
	case outLoaded:
		c.misses.Add(1)
	case outLocalHit:
		c.localHits.inc()
	}
	if coalesced {
		c.coalesced.Add(1)
	}
}

// answered counts how one Get was answered, in Stats and, with
// OpenTelemetry on, on the gets counter and the Get's span: every count of
// an answer goes through here (or answeredMany). coalesced: from another
// caller's flight; through: loaded without Redis (the outage policy).
func (g *Guard) answered(ctx context.Context, o outcome, coalesced, through bool) {
	g.stats.count(o, coalesced)
	if g.tel != nil {
		g.tel.settled(ctx, o, coalesced, through, false)
	}
}

// answeredMany is answered for one ID of a GetMany: its span is the
// GetMany's, which gets no per-ID outcome.
func (g *Guard) answeredMany(ctx context.Context, o outcome, coalesced, through bool) {
	g.stats.count(o, coalesced)
	if g.tel != nil {
		g.tel.settled(ctx, o, false, through, true)
	}
}

// loaded counts n IDs asked of a load function, and their failure if err
// is one (ErrNotFound is an answer, not a failure): every load of every
// entry point is counted here.
func (g *Guard) loaded(n int, err error) {
	g.stats.loads.Add(uint64(n))
	if err != nil && !errors.Is(err, ErrNotFound) {
		g.stats.loadErrors.Add(uint64(n))
	}
}

// Stats returns a snapshot of the Guard's counters.
func (g *Guard) Stats() Stats {
	c := &g.stats
	cs := g.coord.Stats()
	return Stats{
		StaleWrites: cs.StaleWrites, LockWaits: cs.Waits, LockTimeouts: cs.Timeouts, Wakeups: cs.Wakeups,
		Hits: c.hits.load(), LocalHits: c.localHits.load(), EmptyHits: c.empty.load(), BloomRejects: c.rejects.load(),
		Misses: c.misses.Load(), Coalesced: c.coalesced.Load(),
		Loads: c.loads.Load(), LoadErrors: c.loadErrors.Load(), RedisErrors: c.redisErrors.Load(),
		CorruptValues: c.corrupt.Load(), SchemaMisses: c.schemaMisses.Load(), BloomBypasses: c.bypasses.Load(),
		LoadThroughs: c.loadThroughs.Load(), Shed: c.shed.Load(), Unconfirmed: c.unconfirmed.Load(), BreakerOpens: c.breakerOpens.Load(),
		AbandonedLoads: c.abandonedLoads.Load(), Refreshes: c.refreshes.Load(),
		Unwritten: uint64(g.unw.n.Load()), WritesLost: c.writesLost.Load(), FilterCopy: uint64(g.copyBytes()),
		FilterNotReady: g.bf.bypassing.Load(),
	}
}

// stripes is a number spread over cache lines, so that parallel calls do
// not bounce one word between cores: each update goes to one stripe and sum
// adds them up. The gate adds and takes back on the stripe a call entered
// on; the hit counters add on any (inc).
type stripes struct {
	s [numStripes]struct {
		n atomic.Int64
		_ [56]byte // a cache line each
	}
}

const (
	stripeBits = 4
	numStripes = 1 << stripeBits
)

// pick returns a stripe for this call, derived from the address of the
// calling goroutine's stack: a goroutine keeps adding on the same stripe
// (its cache line stays with its core), and goroutines mostly land on
// different ones. The address is only hashed; a stack that moves just
// picks another stripe.
func (s *stripes) pick() int {
	var onStack byte
	a := uint64(uintptr(unsafe.Pointer(&onStack))) >> 10      // stacks are at least 2 KiB apart
	return int((a * 0x9e3779b97f4a7c15) >> (64 - stripeBits)) // Fibonacci hashing onto the stripes
}

func (s *stripes) add(i int, d int64) { s.s[i].n.Add(d) }

// inc counts one on this call's stripe; load is exact once the incs have
// returned.
func (s *stripes) inc()         { s.add(s.pick(), 1) }
func (s *stripes) load() uint64 { return uint64(s.sum()) }

// sum is exact once every add has returned.
func (s *stripes) sum() int64 {
	var n int64
	for i := range s.s {
		n += s.s[i].n.Load()
	}
	return n
}
