package guard

import (
	"context"
	"sync"
)

// Flush waits until the fill flights and refresh-ahead reloads under way
// in this process when it was called have ended, or until ctx is done (it
// then returns ctx's error).
//
// A miss answers its callers as soon as the load returns, and its flight
// writes the value (or the empty marker) to Redis after that, one round
// trip later (see the package doc). So right after a Get that missed
// returns, Redis may not hold the entry yet; after Flush it does, unless a
// write to the source of truth overtook the load (the flight's write is
// then refused) or Redis failed. Likewise a Get that served a value past
// its refresh-at time (Options.RefreshAhead) returns before the reload it
// started; after Flush the reloaded value is in Redis, or the reload gave
// up (another process held the key, or it failed and was logged).
// GetMany writes before it returns: it leaves nothing for Flush.
//
// Nothing in the library needs it: it is for tests, tools and demos that
// look at Redis right after a Get, or count the round trips a Get caused.
// Close waits for all of these too.
func (g *Guard) Flush(ctx context.Context) error {
	for _, done := range g.pending.snapshot() {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// pending is the set of fill flights and refresh-ahead reloads under way
// (for Flush). They add and remove themselves; only misses and refreshes
// pay for it.
type pending struct {
	mu      sync.Mutex // guards flights
	flights map[chan struct{}]struct{}
}

// add registers a flight or reload, which calls the function it returns
// as it ends.
func (p *pending) add() (end func()) {
	done := make(chan struct{})
	p.mu.Lock()
	if p.flights == nil {
		p.flights = make(map[chan struct{}]struct{})
	}
	p.flights[done] = struct{}{}
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.flights, done)
		p.mu.Unlock()
		close(done)
	}
}

// snapshot returns the flights and reloads under way.
func (p *pending) snapshot() []chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]chan struct{}, 0, len(p.flights))
	for done := range p.flights {
		out = append(out, done)
	}
	return out
}
