package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cacheguard/cacheguard/internal/batch"
)

// GetMany's batch load: the misses of one GetMany whose locks it holds load
// together in one call of its BatchLoadFunc, each ID still written by its
// own flight under its own lock (flight.go); a miss that waited for another
// process first loads on its own.

// batchLoad gathers the loads of one GetMany's miss flights into one call
// of its load function, as a batch (package batch) whose one place in
// flight the GetMany holds while a miss is undecided: it has neither asked
// to load, started waiting for another holder, joined another flight, nor
// ended. The misses that ask queue meanwhile; the last decision releases
// the place and the first of them loads them all in one call. A miss that
// asks later (it waited, then took over from a holder that died) loads on
// its own.
type batchLoad[T any] struct {
	g         *Guard
	load      BatchLoadFunc[T]
	loads     *batch.Batcher[loadReq[T]]
	undecided atomic.Int64 // misses not decided yet; the last to decide releases the place
}

// loadReq is one miss's part of a batch load: its ID, then its answer.
type loadReq[T any] struct {
	id  string
	v   T
	err error
}

// member is one miss of a batch.
type member[T any] struct {
	b       *batchLoad[T]
	decided atomic.Bool
}

func newBatch[T any](g *Guard, load BatchLoadFunc[T], n int) *batchLoad[T] {
	b := &batchLoad[T]{g: g, load: load}
	b.undecided.Store(int64(n))
	b.loads = batch.New(1, n, b.run, g.sup.spawn)
	b.loads.Hold()
	return b
}

// decide records that the miss is decided (once): called by the
// Coordinator when the miss starts waiting for another holder, by join when
// it joins another flight, when it asks to load, and when it ended.
func (m *member[T]) decide() {
	if m.decided.CompareAndSwap(false, true) && m.b.undecided.Add(-1) == 0 {
		m.b.loads.Release()
	}
}

// load is the miss's load function: it queues its ID for the batch load
// and waits for its answer (or loads on its own once the batch has run).
func (m *member[T]) load(ctx context.Context, id string) (T, error) {
	c := &batch.Call[loadReq[T]]{Req: loadReq[T]{id: id}, Queued: m.decide}
	if err := m.b.loads.Do(ctx, c); err != nil {
		var zero T
		if errors.Is(err, batch.ErrPanicked) {
			return zero, fmt.Errorf("%w: the batch load of %q panicked", ErrLoaderPanic, id)
		}
		return zero, err
	}
	return c.Req.v, c.Req.err
}

// run is one call of the load function for calls' IDs, bounded by
// LoadTimeout (a batch of several runs on its leader's ctx without its
// deadline), with a span of its own: it serves several flights.
func (b *batchLoad[T]) run(ctx context.Context, calls []*batch.Call[loadReq[T]]) {
	ctx, cancel := context.WithTimeout(ctx, b.g.opts.LoadTimeout)
	defer cancel()
	ids := make([]string, len(calls)) // each member's Load counts its ID
	for i, c := range calls {
		ids[i] = c.Req.id
	}
	ctx, record := b.g.tel.load(ctx)
	var values map[string]T
	var err error
	defer func() { record(err) }() // a panic too: it goes on up (see member.load)
	values, err = b.load(ctx, ids)
	for _, c := range calls {
		r := &c.Req
		switch v, ok := values[r.id]; {
		case err != nil:
			r.err = err
		case ok:
			r.v = v
		default:
			r.err = ErrNotFound
		}
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
