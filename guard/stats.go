package guard

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
