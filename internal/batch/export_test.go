package batch

import "time"

// Waiting reports how many calls wait for a batch, for tests that hold one
// and queue others behind it.
func (b *Batcher[Q]) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// Disarm stops the alarm and reports whether it was set to ring.
func (b *Batcher[Q]) Disarm() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.alarm != nil && b.alarm.Stop() {
		b.rings.Done()
		b.ringAt = time.Time{}
		return true
	}
	return false
}

// OnRing sets a function that runs as the alarm rings, before it takes the
// batcher's lock; set it before the first Do.
func (b *Batcher[Q]) OnRing(f func()) { b.testRang = f }
