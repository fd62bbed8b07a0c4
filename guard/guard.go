// Package guard puts a guard in front of cache-aside reads on Redis: floods
// of unknown IDs never reach the database (penetration), a hot key that
// expires is loaded once across all processes (stampede), and TTLs are spread
// so keys loaded together do not expire together (avalanche).
//
// Open one [Guard] per kind of entity with [New] (give [FilterOptions] an
// ID source, or call [Guard.Rebuild]), read with [Get] or a typed handle
// from [For], and after each committed write call [Set] for an upsert (it
// adds the ID to the filter too), [Guard.Delete] for a delete, or
// [Guard.Invalidate]. A Get (the engine: internal/aside) takes five steps:
// (1) the ID is checked, (2) with [LocalOptions] memory answers, (3) one
// round trip reads the filter, the value and any "not found" marker, (4) a
// value, a reject or a marker answers, (5) a miss joins the ID's flight,
// which loads under a per-key Redis lock and writes before it answers. When
// Redis cannot answer it loads through; Redis errors wrap [ErrUnavailable].
package guard

import (
	"context"
	"errors"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/aside"
)

// Guard guards the reads of one kind of entity. It is safe for concurrent use.
type Guard struct{ e *aside.Engine }

func init() { aside.EngineOf = func(g any) *aside.Engine { return g.(*Guard).e } }

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
	e, err := aside.New(ctx, rdb, name, opts.engine())
	if err != nil {
		return nil, err
	}
	return &Guard{e: e}, nil
}

// Name returns the Guard's name.
func (g *Guard) Name() string { return g.e.Name() }

// Logger returns the Guard's logger: Options.Logger with the Guard's name,
// writing each cause at most once per 10 s (with a count of those held
// back). The adapters log through it, so an outage writes a few lines a
// minute whatever the entry point.
func (g *Guard) Logger() *slog.Logger { return g.e.Logger() }

// Close shuts the Guard: every call that starts afterwards, of every method
// and of Get (values held in process memory included), fails with ErrClosed.
// Close waits for the calls in progress and every goroutine the Guard
// started (flights, refreshes, replays, rebuilds, lock releases), so that
// their cache writes land before the caller closes the Redis client.
// Closing again returns the first Close's result.
func (g *Guard) Close() error { return g.e.Close() }

// Stats returns a snapshot of the Guard's counters.
func (g *Guard) Stats() Stats { return Stats(g.e.Stats()) }

// errNil is what an entry point returns for a nil Guard or function.
func errNil(what string) error {
	return errors.New("cacheguard: " + what + " needs a non-nil Guard and load function")
}
