package aside

import (
	"context"
	"time"
)

// What guard's tests reach inside the engine (guard/export_test.go).

// ReadsWaiting is how many of e's reads wait for a round trip (see
// runReads), for tests that hold one and queue others behind it.
func ReadsWaiting(e *Engine) int { return e.rd.batch.Waiting() }

// Flush waits for the flights and refreshes under way on e (see flush).
func Flush(ctx context.Context, e *Engine) error { return e.flush(ctx) }

// Field is the hash field of e's entries, once a Get or Set bound e to a
// type (see schemaField).
func Field(e *Engine) string { return e.field() }

// MaxUnwritten is how many unwritten IDs an Engine keeps before it overflows.
const MaxUnwritten = maxUnwritten

// AgeWrites makes the writes e remembers (lost.go) look d older, for tests
// of a restart from an old dump that cannot wait for it.
func AgeWrites(e *Engine, d time.Duration) {
	m := e.marks
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.ring {
		m.ring[i].at = m.ring[i].at.Add(-d)
	}
}

// SetAfterRead runs f between each Get's read and its answer until restore.
func SetAfterRead(f func(id string)) (restore func()) {
	afterRead = f
	return func() { afterRead = nil }
}

// SetBeforeAutoRebuild runs f in each automatic rebuild between its checks
// and the rebuild lock, until restore.
func SetBeforeAutoRebuild(f func()) (restore func()) {
	beforeAutoRebuild = f
	return func() { beforeAutoRebuild = nil }
}

// AutoRebuilding reports whether an automatic rebuild of e is under way
// (see autoRebuild).
func AutoRebuilding(e *Engine) bool { return e.bf.rebuilding.Load() }

// SetJoined tells f of each caller that joins a flight under way on e (its
// value key), until restore.
func SetJoined(e *Engine, f func(key string)) (restore func()) {
	e.joinedHook.Store(&f)
	return func() { e.joinedHook.Store(nil) }
}

// SetShared tells f of each caller of a shared read on e (see readShared):
// first before the read of the caller that makes it, and each caller that
// joins it, until restore. f may block the first to hold the read.
func SetShared(e *Engine, f func(first bool)) (restore func()) {
	e.sharedHook.Store(&f)
	return func() { e.sharedHook.Store(nil) }
}

// WatchEvery is watchEvery, for tests that wait for a number of the
// watcher's turns.
const WatchEvery = watchEvery

// SetWatch turns e's watcher (see watch) off or back on, for tests that
// need a lost write noticed by a read, and for the control of the watcher's.
func SetWatch(e *Engine, on bool) { e.watchOff.Store(!on) }

// LocalCopy reports what e's local cache holds for id: "none", "fresh" (a
// copy to serve) or "gone" (a copy whose Redis entry has expired), for tests
// that wait for a copy to expire instead of sleeping past its TTL.
func LocalCopy(e *Engine, id string) string {
	if e.local == nil {
		return "none"
	}
	_, st := e.local.get(id)
	return [...]string{localNone: "none", localFresh: "fresh", localGone: "gone"}[st]
}

// RefreshCopy fetches e's copy of its filter now (see keepCopy), for tests
// that need it taken at a known point.
func RefreshCopy(ctx context.Context, e *Engine) error {
	_, err := e.refreshCopy(ctx)
	return err
}

// HoldCopy stops e's own refreshes of its copy (keepCopy) once the one under
// way ended, until release: a test takes the copy with RefreshCopy alone.
func HoldCopy(e *Engine) (release func()) {
	set := func(held bool) {
		e.bf.copyHold.Lock()
		e.bf.copyHeld = held
		e.bf.copyHold.Unlock()
	}
	set(true)
	return func() { set(false) }
}
