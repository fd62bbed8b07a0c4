package aside

import (
	"context"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/codec"
)

// RefreshOptions is guard.RefreshOptions (documented there).
type RefreshOptions struct {
	At float64
}

// pastRefreshAt reports whether a cached frame is past its refresh-at time.
func pastRefreshAt(raw []byte) bool {
	at, ok := codec.RefreshAt(raw)
	return ok && !time.Now().Before(at)
}

// refresh starts the background refresh of a hit that is past its
// refresh-at time, unless one runs for the key in this process. The
// goroutine is the supervisor's (cancelled and waited for by Close; flush
// waits for it too); it is started from inside the gate, so Close cannot
// miss it.
func refresh[T any](g *Engine, id, vkey string, raw []byte, load LoadFunc[T]) {
	if !pastRefreshAt(raw) {
		return
	}
	if _, running := g.refreshing.LoadOrStore(vkey, struct{}{}); running {
		return
	}
	if !g.sup.goRun(func(ctx context.Context) {
		defer g.refreshing.Delete(vkey)
		defer func() { // a panic in the load (raised again here by bounded): the value expires at its TTL
			if p := recover(); p != nil {
				g.log.Error("cacheguard: refresh ahead: load panicked", "id", id, "panic", p)
			}
		}()
		ctx, cancel := context.WithTimeout(ctx, g.flights.Timeout)
		defer cancel()
		c := &flight[T]{g: g, id: id, vkey: vkey, load: load, refresh: true}
		g.stats.refreshes.Add(1)
		if err := g.coord.TryRun(ctx, vkey, g.field(), c); err != nil && g.sup.ctx.Err() == nil { // not Close
			g.log.Warn("cacheguard: refresh ahead failed; the value expires at its TTL", "id", id, "err", g.fail(ctx, "refresh", id, err))
		}
	}) {
		g.refreshing.Delete(vkey)
	}
}

func resolveRefresh(r *RefreshOptions) (*RefreshOptions, error) {
	if r == nil {
		return nil, nil
	}
	o := *r
	if o.At == 0 {
		o.At = 0.85
	}
	if !(o.At > 0 && o.At < 1) {
		return nil, fmt.Errorf("%w: RefreshAhead.At %v not in (0, 1)", ErrInvalidOptions, o.At)
	}
	return &o, nil
}
