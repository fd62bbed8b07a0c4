package guard

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/lock"
)

// LoadFunc loads the value of id from the source of truth. It reports an ID
// that does not exist with an error wrapping ErrNotFound (for example
// fmt.Errorf("%w: %w", guard.ErrNotFound, sql.ErrNoRows)); any other error
// fails the Get and is not cached.
type LoadFunc[T any] func(ctx context.Context, id string) (T, error)

// Get returns the value of id: from the cache, or from load on a miss (see
// the package doc for the steps). It returns ErrNotFound (test with
// errors.Is) when the ID does not exist, ErrInvalidKey for a malformed ID,
// the load's error wrapped when load fails, ErrBusy, ErrClosed, ErrWrongType
// when g is bound to another type, and errors wrapping ErrUnavailable when
// Redis fails (never ErrNotFound). load runs on a context detached from ctx
// and bounded by LoadTimeout, shared by every caller of id in this process
// whose Get started before the load did; Get itself returns as soon as ctx
// is done.
func Get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	if g == nil || load == nil {
		var zero T
		return zero, errNil("Get")
	}
	if g.tel != nil { // one call deep either way
		return getTraced(ctx, g, id, load)
	}
	return get(ctx, g, id, load)
}

// getTraced is get inside the Get's span.
func getTraced[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	ctx, span := g.tel.start(ctx, "cacheguard.Get")
	v, err := get(ctx, g, id, load)
	g.tel.end(ctx, span, err)
	return v, err
}

// get is the five steps of a Get, top-down (g and load are not nil: Get
// checked them).
func get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	var zero T
	if err := bind[T](g); err != nil {
		return zero, err
	}
	// Before the local copy too: a read made after a failover, before the
	// Guard knew of it, may have kept the entry a lost write had replaced.
	if g.unw.has(id) { // its write has not reached Redis yet: the entry may be the one it replaces
		return getUnwritten(ctx, g, id, load)
	}
	gone := false // the local copy expired with its Redis entry
	if g.local != nil {
		v, st := localHit[T](ctx, g, id)
		if st == localFresh {
			return v, nil
		}
		gone = st == localGone
	}
	pass, err := g.sup.enter()
	if err != nil {
		return zero, err
	}
	defer g.sup.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		return zero, err
	}
	from := since{at: g.starts.Load()} // a flight that answers this Get must have started after it (join)
	replays := g.unw.replayed.Load()   // a replay landing during the read: see below
	if g.local != nil {
		from.epoch = g.local.epoch.Load() // before the read: see local.put
	}
	// Step 3 in this goroutine: a hit, a reject or a marker is answered
	// from a read made after this Get started, never from another caller's
	// (with Local, from one shared with the ID's other callers if no write
	// was heard since it started: see readShared).
	var r readResult
	p := peekedFor(ctx, g, id)
	if p != nil && p.answered { // counted by Peek
		return zero, ErrNotFound
	}
	if p != nil && p.failed != nil { // Peek found Redis unable to answer (it asked the copy): do not wait for it twice
		return loadThrough(ctx, g, id, vkey, load, from, p.failed)
	}
	ok := p != nil
	if ok {
		r, replays = p.r, p.replays // the replays that landed since Peek's read count too
	}
	if !ok && gone && !g.outage.troubled.Load() {
		// The entry has expired in Redis: a read would miss. The lock
		// attempt's re-check reads whatever another process stored since.
		r, ok = readResult{verdict: verdictMiss}, true
	}
	if !ok {
		done, err := g.outage.before()
		if err != nil { // the breaker is open: Redis is not asked (nor counted as failing)
			err = fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err)
		} else {
			r, err = g.readFor(ctx, id, vkey, from)
			g.outage.after(done, err)
		}
		if downOrRefusing(err) {
			if err := g.absentInCopy(ctx, id, err); err != nil {
				return zero, err
			}
			return loadThrough(ctx, g, id, vkey, load, from, err)
		}
		if err != nil {
			return zero, err
		}
	}
	if afterRead != nil {
		afterRead(id)
	}
	// The read's check found the ID's write lost by Redis (lost.go), or a
	// replay landed while it read: the entry may be the one a write replaced.
	if g.unw.has(id) || g.unw.replayed.Load() != replays {
		g.giveBack(r.held, vkey)
		return loadThrough(ctx, g, id, vkey, load, from, fmt.Errorf("cacheguard: %s %q: %w", g.name, id, errUnwritten))
	}
	if v, ok, err := answerRead(ctx, g, id, vkey, r, load, from); ok {
		return v, err
	}
	return fill(ctx, g, id, vkey, load, from, r.held)
}

// afterRead, set by tests alone, runs between a Get's read and its answer,
// to replay a replay landing there.
var afterRead func(id string)

// getUnwritten answers a Get of an ID whose last write did not reach Redis
// from the load function alone, as in an outage, until the write is
// replayed (replay.go).
func getUnwritten[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	pass, err := g.sup.enter()
	if err != nil {
		var zero T
		return zero, err
	}
	defer g.sup.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		var zero T
		return zero, err
	}
	cause := fmt.Errorf("cacheguard: %s %q: %w", g.name, id, errUnwritten)
	return loadThrough(ctx, g, id, vkey, load, since{at: g.starts.Load()}, cause)
}

// since is when a caller started: Guard.starts then, and the local cache's
// epoch then (0 without Options.Local). A flight or shared read takes its
// number with starts.Add(1) as it starts, so it started after the caller
// exactly when its number is greater than the caller's at: the atomic
// orders the two, with no clock to read on every Get and no two starts on
// the same tick.
type since struct {
	at    uint64
	epoch uint64
}

// startedBefore reports whether a flight or shared read numbered n started
// before the caller at from (see since).
func (from since) startedBefore(n uint64) bool { return n <= from.at }

// readFor is step 3 for a caller that started at from: the probe and the
// read (see read), or with Options.Local a read shared with the ID's other
// callers (see readShared).
func (g *Guard) readFor(ctx context.Context, id, vkey string, from since) (readResult, error) {
	if g.local != nil {
		return g.readShared(ctx, id, vkey, from, true)
	}
	return g.read(ctx, id, vkey, true)
}

// answerRead answers a Get from a read: a reject or a marker
// (ErrNotFound) or a value, which it keeps in the local cache and perhaps
// refreshes. ok is false when the read answers nothing (a miss, or a
// corrupt entry, dropped): load.
func answerRead[T any](ctx context.Context, g *Guard, id, vkey string, r readResult, load LoadFunc[T], from since) (v T, ok bool, err error) {
	switch r.verdict {
	case verdictRejected:
		g.answered(ctx, outRejected, false, false)
		return v, true, ErrNotFound
	case verdictUnconfirmed:
		return v, true, g.unconfirmed(ctx, id, nil)
	case verdictEntry:
		if e := decodeEntry[T](ctx, g, vkey, r.raw); e.ok {
			g.answered(ctx, e.found.outcome, false, false)
			if e.err == nil && g.local != nil {
				g.local.put(id, r.raw, kept(g, e.v), r.ttl, r.sent, from.epoch)
			}
			if e.err == nil && g.opts.RefreshAhead {
				refresh(g, id, vkey, r.raw, load)
			}
			return e.v, true, e.err
		}
	}
	return v, false, nil
}

// localHit answers id from the in-process cache (Options.Local) if it holds
// a copy. It runs outside the close gate's count: it touches no Redis
// connection, and the otter cache stays safe to read while Close empties
// it; once Close has begun, it answers nothing and the caller's gate.enter
// reports ErrClosed. IDs are not checked here: a malformed one was never
// stored, so it misses and Get refuses it afterwards.
func localHit[T any](ctx context.Context, g *Guard, id string) (T, localState) {
	if g.sup.closed.Load() {
		var zero T
		return zero, localNone
	}
	v, st := fromLocal[T](g, id)
	if st == localFresh {
		g.answered(ctx, outLocalHit, false, false)
	}
	return v, st
}

// fromLocal is the copy of id in process memory, if there is one that
// decodes (one that does not is dropped).
func fromLocal[T any](g *Guard, id string) (T, localState) {
	var zero T
	e, st := g.local.get(id)
	if st != localFresh {
		return zero, st
	}
	if v, ok := e.value.(T); ok { // decoded once; assignment copies it all
		return v, localFresh
	}
	if c, ok := e.value.(copied[T]); ok { // decoded once, a deep copy for each caller
		return c.copy(c.v), localFresh
	}
	var v T
	if codec.Decode(g.opts.Codec, e.frame, &v) == nil {
		return v, localFresh
	}
	g.local.drop(id)
	return zero, localNone
}

// The read plan: what a Get's read sends (the bloom probe, the key's lock)
// and what the reads found teaches it.

// Lock with the read. While reads miss often (a cold cache), a read that is
// likely to miss takes the key's lock itself: SET NX PX of a token goes in
// the read's pipeline before the HGET, so that HGET is the re-check with the
// lock taken, and the miss's flight starts at the load (Coordinator.RunHeld):
// two round trips instead of three. Likely to miss: reads carry the bloom
// probe, reads that found nothing mostly loaded and their locks were mostly
// used (Lock bias), and this process has not read the ID lately (seenTable).
// A lock taken for nothing is given back: released at once if the entry was
// there or the Get joined a flight of its process (giveBack), left to lapse
// after a reject. The lease is short, so such a lock blocks nobody for long;
// a load that outlasts a third of it has it extended by the watchdog.
// docs/cost.md has the measurements.
const readLockLease = 500 * time.Millisecond

// seenTable remembers the IDs this process read lately: 8,192 sets of 4
// ID hashes (256 KB). An ID goes into a free way of its set, or else one
// picked at random: in a table of one way per set, two IDs read often
// whose hashes met in a slot pushed each other out between their reads,
// and each read of either took a lock for nothing. A false "not seen"
// costs a lock taken and given back; a false "seen" (two IDs with one
// 64-bit hash) costs the usual lock attempt.
type seenTable struct {
	seed maphash.Seed
	sets [1 << 13][4]atomic.Uint64
}

func (s *seenTable) set(id string) (*[4]atomic.Uint64, uint64) {
	h := maphash.String(s.seed, id) | 1 // 0 marks a free way
	return &s.sets[h%uint64(len(s.sets))], h
}

// saw records that this process read id.
func (s *seenTable) saw(id string) {
	set, h := s.set(id)
	free := -1
	for i := range set {
		switch set[i].Load() {
		case h: // hot IDs: no write, no cache-line traffic
			return
		case 0:
			if free < 0 {
				free = i
			}
		}
	}
	if free < 0 {
		free = rand.IntN(len(set))
	}
	set[free].Store(h)
}

// seen reports whether this process read id lately.
func (s *seenTable) seen(id string) bool {
	set, h := s.set(id)
	for i := range set {
		if set[i].Load() == h {
			return true
		}
	}
	return false
}

// lockWithRead reports whether a read of id that sends the bloom probe
// should take the key's lock too (see above). The table is allocated when
// the first miss opens the gate: a Guard whose reads always hit never has
// one.
func (g *Guard) lockWithRead(id string) bool {
	if g.rd.lockBias.Load() <= 0 {
		return false
	}
	s := g.rd.seen.Load()
	return s != nil && !s.seen(id)
}

// sawRead records, after a read, that this process read id: a hit, or a
// miss whose flight is about to fill it (the ID's other callers here then
// join that flight instead of taking its lock).
func (g *Guard) sawRead(id string) {
	if s := g.rd.seen.Load(); s != nil {
		s.saw(id)
	}
}

// Lock bias. lockBias rises by one with each read that found nothing and
// loads (a miss: its lock is useful), and falls by lockPenalty with each
// read that found nothing to load (a reject) or took a lock and found the
// entry (another process had filled it: a lock for nothing). Reads take
// locks while it is above zero, so the gate closes under a flood of
// unknown IDs, and in a fleet whose other processes have filled most of
// what this one reads for the first time.
const (
	lockBiasMax = 64
	lockPenalty = 4
)

// lockUseful records a miss (see Lock bias); the first one makes the table
// of IDs read lately.
func (g *Guard) lockUseful() {
	if g.rd.seen.Load() == nil {
		g.rd.seen.CompareAndSwap(nil, &seenTable{seed: maphash.MakeSeed()})
	}
	if g.rd.lockBias.Add(1) > lockBiasMax {
		g.rd.lockBias.Store(lockBiasMax)
	}
}

// lockUseless records a reject, or a lock a read took for an entry that
// was there (see Lock bias).
func (g *Guard) lockUseless() {
	if g.rd.lockBias.Add(-lockPenalty) < 0 {
		g.rd.lockBias.Store(0)
	}
}

// giveBack releases a lock that a read took and its Get did not use, in a
// goroutine of the supervisor's: the Get does not wait for it. Close
// waits for it (and cancels it: the lock then lapses); flush too.
func (g *Guard) giveBack(l *lock.Lock, vkey string) {
	if l == nil {
		return
	}
	g.sup.goRun(func(ctx context.Context) {
		if err := g.coord.Release(ctx, l, vkey); err != nil && ctx.Err() == nil {
			_ = g.fail(ctx, "release", "", err) // counted and logged; the lock lapses
		}
	})
}

// Probe order. While reads mostly hit, the HGET goes alone: a hit is one
// command, like a plain GET. A read that finds nothing must then ask the
// filter in a second round trip, so every such read adds missCredit to
// credit, and while credit is above zero reads send the bloom probe and the
// HGET together (pipelined): a flood of unknown IDs costs one round trip
// each after the first. Every hit takes one back. At a steady hit ratio h
// the pipelined share settles where h·1 = (1−h)·missCredit; with
// missCredit 16 reads go alone once more than about 94% of them hit. A new
// Guard starts with missCredit (New): its first reads are likely misses.
// With Local every read probes (what reaches Redis mostly misses) and the
// credit is left alone. Get's read and GetMany's follow this one rule.
const (
	missCredit = 16
	maxCredit  = 1024
)

// probing reports whether a read sends the bloom probe with its HGET.
func (r *reader) probing(local bool) bool { return local || r.credit.Load() > 0 }

// settle records what reads that probed (probed) found: hits pay the credit
// back, never below zero; misses add missCredit each, up to maxCredit.
func (r *reader) settle(local, probed bool, hits, misses int64) {
	if local {
		return
	}
	if hits > 0 && probed {
		if c := r.credit.Add(-hits); c < 0 {
			r.credit.CompareAndSwap(c, 0) // paid back below zero: floor it
		}
	}
	if misses > 0 && r.credit.Add(missCredit*misses) > maxCredit {
		r.credit.Store(maxCredit)
	}
}
