package aside

import (
	"context"
	"sync"
)

// flush waits until the fill flights and refresh-ahead reloads under way
// in this process when it was called have ended, or until ctx is done (it
// then returns ctx's error).
//
// A Get that missed returns after its flight wrote the entry, but a Get
// that served a value past its refresh-at time (Options.RefreshAhead)
// returns before the reload it started, and a caller that left on its own
// ctx leaves its flight running. After flush those have written what they
// loaded, or given up (another process held the key, a write overtook the
// load, or Redis failed: logged). Close waits for these too; tests call
// flush through export_test.go.
func (g *Engine) flush(ctx context.Context) error {
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
// (for flush). They add and remove themselves; only misses and refreshes
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
