package guard

import (
	"context"
	"math"
	"time"

	"github.com/cacheguard/cacheguard/internal/batch"
)

// What guard's tests (package guard_test) reach inside a Guard.

// Flush waits until g's calls, flights, refresh-ahead reloads, lock
// releases and loads under way have ended, or until ctx is done (it then
// returns ctx's error): tests call it instead of sleeping. A Get that served
// a value past its refresh-at time returns before the reload it started,
// and a caller that left on its own ctx leaves its flight running; after
// Flush those have written what they loaded, or given up. Each of them is
// inside g's gate (see supervisor). The gate is empty once two sums read
// zero: one sum may read a goroutine's stripe before it entered and its
// parent's after it left, but the next one sees it.
func Flush(ctx context.Context, g *Guard) error {
	for zeros := 0; zeros < 2; {
		if g.sup.gate.inside.sum() == 0 {
			zeros++
			continue
		}
		zeros = 0
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Field is the hash field of g's entries, once a Get or Set bound g to a
// type (see schemaField).
func Field(g *Guard) string { return g.field() }

// MaxUnwritten is how many unwritten IDs a Guard keeps before it overflows.
const MaxUnwritten = maxUnwritten

// AgeWrites makes the writes g remembers (lost.go) look d older, for tests
// of a restart from an old dump that cannot wait for it.
func AgeWrites(g *Guard, d time.Duration) {
	m := g.marks
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.ring {
		m.ring[i].at = m.ring[i].at.Add(-d)
	}
}

// WatchEvery is how often the watcher of a Guard that wrote looks for a
// restart of Redis, for tests that wait for a number of its turns.
const WatchEvery = watchEvery

// AutoRebuilding reports whether an automatic rebuild of g is under way
// (see autoRebuild).
func AutoRebuilding(g *Guard) bool { return g.bf.rebuilding.Load() }

// LocalCopy reports what g's local cache holds for id: "none", "fresh" (a
// copy to serve) or "gone" (a copy whose Redis entry has expired), for tests
// that wait for a copy to expire instead of sleeping past its TTL.
func LocalCopy(g *Guard, id string) string {
	if g.local == nil {
		return "none"
	}
	_, st := g.local.get(id)
	return [...]string{localNone: "none", localFresh: "fresh", localGone: "gone"}[st]
}

// RefreshCopy fetches g's copy of its filter now (see keepCopy), for tests
// that need it taken at a known point.
func RefreshCopy(ctx context.Context, g *Guard) error {
	_, err := g.refreshCopy(ctx)
	return err
}

// SetReadsInFlight replaces g's read batcher, before its first Get: n round
// trips at once (negative: every read alone, at once), for the control of
// the batching and tests that need reads to queue behind one.
func SetReadsInFlight(g *Guard, n int) {
	if n < 0 {
		g.rd.batch = batch.New(math.MaxInt, 1, g.runReads, g.sup.spawn)
		return
	}
	g.rd.batch = batch.New(n, readBatchMax, g.runReads, g.sup.spawn)
}

// CopyGeneration is the generation of g's copy of its filter (0: none).
func CopyGeneration(g *Guard) int64 {
	if f := g.bf.f.Load(); f != nil {
		gen, _ := f.CopyInfo()
		return gen
	}
	return 0
}

// StopReadAlarm stops the read batcher's alarm (see batch.Batcher.Stop) and
// reports whether it was set to ring.
func StopReadAlarm(g *Guard) bool { return g.rd.batch.Stop() }
