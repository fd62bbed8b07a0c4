package batch

// Waiting reports how many calls wait for a batch, for tests that hold one
// and queue others behind it.
func (b *Batcher[Q]) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// OnRing sets a function that runs as the alarm rings, before it takes the
// batcher's lock; set it before the first Do.
func (b *Batcher[Q]) OnRing(f func()) { b.testRang = f }

// OnYield sets a function that runs instead of runtime.Gosched when a
// request gathers a burst; set it before the first Do.
func (b *Batcher[Q]) OnYield(f func()) { b.testYield = f }

// InFlight reports how many batches hold a place in flight (Hold's too).
func (b *Batcher[Q]) InFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight
}
