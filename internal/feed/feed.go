// Package feed is what a change feed that writes through Guards (the
// PostgreSQL follower, follow/postgres) reaches inside a Guard beyond
// package guard's API: the feed's position, kept in each Guard's Redis, and
// a read of what Redis holds of some IDs, for the follower's inspector. It
// promises nothing to anyone else: package guard implements it, and a
// Guard's Feed method returns it.
package feed

import (
	"context"
	"time"
)

// Engine is a Guard as a change feed sees it. Guard.Feed returns equal
// values for the same Guard, so an Engine can key a map.
type Engine interface {
	// Position returns the position stored for feed (0: none).
	Position(ctx context.Context, feed string) (uint64, error)
	// SetPosition sets feed's position to pos if Redis still holds from
	// (0: none; on a Cluster, each master's copy what was last seen there),
	// and returns what Redis holds now: pos, or the lowest value it found
	// instead (a lower one says Redis lost writes).
	SetPosition(ctx context.Context, feed string, from, pos uint64) (uint64, error)
	// Inspect reads what Redis holds of ids in one round trip (one script
	// and one probe of the filter per ID); it writes nothing and loads
	// nothing.
	Inspect(ctx context.Context, ids []string) ([]Held, error)
}

// Held is what Redis holds of one ID, read as a Get in another process
// reads it (no local cache, no copy of the filter), for the follower's
// inspector. Now and Filled are on the clock of the Redis node that holds
// the ID, so they compare with each other whatever the processes' clocks.
type Held struct {
	Now      time.Time // Redis's clock when read; zero: not read (an ID the Guard refuses)
	Filled   time.Time // when the entry was written; zero: no entry, or one from before fill times
	Values   int       // schema versions whose entry holds a value
	Markers  int       // schema versions whose entry holds the empty marker
	Admitted bool      // the filter may hold the ID (true too while it is not ready: Gets load through then)
}
