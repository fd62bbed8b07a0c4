package guard

import "context"

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
