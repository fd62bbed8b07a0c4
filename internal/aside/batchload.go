package aside

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
)

// batchLoad gathers the loads of one GetMany into one call of its load
// function. Each miss is undecided until it takes its lock and asks to load,
// starts waiting for another holder, or ends; once no miss is undecided, the
// batch loads the IDs that asked, in one call. A miss that asks after that
// (it waited, then took over from a holder that died) loads on its own.
type batchLoad[T any] struct {
	g    *Engine
	load BatchLoadFunc[T]

	mu        sync.Mutex    // guards the fields below, and every member's decided
	undecided int           // misses that have neither asked nor waited nor ended
	asked     []string      // IDs waiting for the batch
	fired     bool          // the batch load has started
	done      chan struct{} // closed when the batch load returned; values and err are set before
	values    map[string]T
	err       error
}

// member is one miss of a batch.
type member[T any] struct {
	b       *batchLoad[T]
	decided bool // guarded by b.mu
}

func newBatch[T any](g *Engine, load BatchLoadFunc[T], n int) *batchLoad[T] {
	return &batchLoad[T]{g: g, load: load, undecided: n, done: make(chan struct{})}
}

// decide records that the miss is no longer undecided (once), and fires
// the batch if it was the last. Callers hold b.mu.
func (m *member[T]) decideLocked() {
	if !m.decided {
		m.decided = true
		m.b.undecided--
	}
	m.b.fireLocked()
}

// Waiting is called by the Coordinator when the miss starts waiting for
// another holder, by join when it joins another flight, and when it ended.
func (m *member[T]) Waiting() {
	m.b.mu.Lock()
	defer m.b.mu.Unlock()
	m.decideLocked()
}

// load is the miss's load function: it asks the batch and waits for the
// batch load, or loads on its own if the batch already fired.
func (m *member[T]) load(ctx context.Context, id string) (T, error) {
	var zero T
	b := m.b
	b.mu.Lock()
	if b.fired {
		b.mu.Unlock()
		ctx, done := b.g.tel.load(ctx)
		values, err := b.load(ctx, []string{id})
		done(err)
		return pick(values, err, id)
	}
	b.asked = append(b.asked, id)
	m.decideLocked()
	b.mu.Unlock()
	select {
	case <-b.done:
		return pick(b.values, b.err, id)
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// pick is id's answer from a batch load.
func pick[T any](values map[string]T, err error, id string) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	if v, ok := values[id]; ok {
		return v, nil
	}
	return zero, ErrNotFound
}

// fireLocked starts the batch load once no miss is undecided and some asked.
// Callers hold b.mu.
func (b *batchLoad[T]) fireLocked() {
	if b.fired || b.undecided > 0 || len(b.asked) == 0 {
		return
	}
	b.fired = true
	ids := b.asked // each member's Load counts its ID
	// The supervisor's; ends when load returns (its members stop waiting
	// at their LoadTimeout). A panic in load fails the batch.
	if !b.g.sup.goRun(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, b.g.opts.LoadTimeout)
		defer cancel()
		defer close(b.done)
		ctx, record := b.g.tel.load(ctx) // a span of its own: the batch serves several GetMany flights
		defer func() {
			if p := recover(); p != nil {
				b.values, b.err = nil, fmt.Errorf("%w: %v\n%s", ErrLoaderPanic, p, debug.Stack())
			}
			record(b.err)
		}()
		b.values, b.err = b.load(ctx, ids)
	}) {
		b.values, b.err = nil, ErrClosed
		close(b.done)
	}
}

// dedupe returns ids without repeats, in their first order.
func dedupe(ids []string) []string {
	seen := make(map[string]struct{}, len(ids))
	out := ids[:0:0]
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}
