package guard

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/lock"
)

// The read plan: what a Get's read sends (the bloom probe, the key's lock)
// and what the reads found teaches it.

// Lock with the read. While reads miss often (a cold cache), a read that is
// likely to miss takes the key's lock itself: SET NX PX of a token goes in
// the read's pipeline before the HGET, so that HGET is the re-check with the
// lock taken, and the miss's flight starts at the load (loader.Coordinator.Run, held):
// two round trips instead of three. Likely to miss: reads carry the bloom
// probe, reads that found nothing mostly loaded and their locks were mostly
// used (Lock bias), and this process has not read the ID lately (seenTable).
// A lock taken for nothing is given back: released at once if the entry was
// there or the Get joined a flight of its process (giveBack), left to lapse
// after a reject. The lease is short, so such a lock blocks nobody for long;
// a load that outlasts a third of it has it extended by the watchdog.
// docs/benchmarks.md has the measurements.
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

// giveBack releases a lock that a read took and its Get did not use, before
// the Get returns: a process may exit as soon as its Gets return, and a lock
// left behind would hold the key's flights in every process for its lease.
// When the caller's ctx has ended, a goroutine of the supervisor's releases
// it (Close waits for it); if Redis cannot answer, the lock lapses.
func (g *Guard) giveBack(ctx context.Context, l *lock.Lock, vkey string) {
	if l == nil {
		return
	}
	if ctx.Err() == nil {
		if err := g.coord.Release(ctx, l, vkey); err == nil || ctx.Err() == nil {
			if err != nil {
				_ = g.fail(ctx, "release", g.idOf(vkey), err) // counted and logged; the lock lapses
			}
			return
		}
	}
	g.sup.goRun(func(ctx context.Context) {
		if err := g.coord.Release(ctx, l, vkey); err != nil && ctx.Err() == nil {
			_ = g.fail(ctx, "release", g.idOf(vkey), err)
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
