package guard

import (
	"context"
	"time"
)

// ReadsWaiting is how many of g's reads wait for a round trip (see
// runReads), for tests that hold one and queue others behind it.
func ReadsWaiting(g *Guard) int { return g.rd.batch.Waiting() }

// Flush waits for the flights and refreshes under way on g (see flush).
func Flush(ctx context.Context, g *Guard) error { return g.flush(ctx) }

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

// SetAfterRead runs f between each Get's read and its answer until restore.
func SetAfterRead(f func(id string)) (restore func()) {
	afterRead = f
	return func() { afterRead = nil }
}
