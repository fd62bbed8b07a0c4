package guard

import (
	"context"
	"time"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/loader"
)

// Refresh ahead (Options.RefreshAhead; stale-while-revalidate for expiry):
// a value is written with a refresh-at time inside its TTL, and a Get that
// finds it past that time serves it at once and starts one refresh in the
// background, so callers of a hot key never wait for its load. One refresh
// per key per process at a time, and one across processes (it takes the
// key's lock once, without waiting: a process that finds the lock held
// leaves the refresh to its holder). The refresh's write checks its lock
// like a fill's, and the Redis TTL is the hard expiry: past it the key is a plain
// miss. Writes are never bypassed: Invalidate, Set and Delete replace or
// drop the entry, so after they return no Get serves the old value, and a
// refresh that read the old row is refused.
//
// Frames written with refresh-ahead carry the refresh-at time (a frame kind
// that versions before this one read as corrupt: turn it on together with a
// new Options.Version during a rolling deploy).

// refreshAt is the share of a value's TTL after which a Get refreshes it:
// about 1.2 loads per TTL, and 15% of the TTL for the refresh to land.
const refreshAt = 0.85

// pastRefreshAt reports whether a cached frame is past its refresh-at time.
func pastRefreshAt(raw []byte) bool {
	at, ok := codec.RefreshAt(raw)
	return ok && !time.Now().Before(at)
}

// refresh starts the background refresh of a hit that is past its
// refresh-at time, as a flight of its own key (one per ID in this process;
// a fill of the ID does not join it). Its goroutine is the supervisor's
// (flush waits for it), started from inside the gate, so Close cannot miss
// it; Close cancels it as it begins (sup.bg), and waits for it.
func refresh[T any](g *Guard, id, vkey string, raw []byte, load LoadFunc[T]) {
	if !pastRefreshAt(raw) {
		return
	}
	g.flights.Go(g.sup.bg, flightKey{kind: refreshFlight, vkey: vkey}, func(ctx context.Context) (flightResult, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(g.sup.bg, cancel) // Close cancels it
		defer stop()
		defer func() { // a panic in the load (raised again here by bounded): the value expires at its TTL
			if p := recover(); p != nil {
				g.log.Error("cacheguard: refresh ahead: load panicked", "id", id, "panic", p)
			}
		}()
		c := &flight[T]{g: g, id: id, vkey: vkey, load: load}
		fresh := func(ctx context.Context, raw []byte, _ time.Duration) bool { // still the value to refresh: load it
			return !pastRefreshAt(raw) && c.decode(ctx, raw)
		}
		g.stats.refreshes.Add(1)
		ran, err := g.coord.TryRun(ctx, vkey, g.field(), loader.Fill{Accept: fresh, Load: c.Load})
		g.ran(ctx, vkey, ran)
		if err != nil && g.sup.bg.Err() == nil { // not Close
			g.log.Warn("cacheguard: refresh ahead failed; the value expires at its TTL", "id", id, "err", g.fail(ctx, "refresh", id, err))
		}
		return flightResult{}, nil
	})
}
