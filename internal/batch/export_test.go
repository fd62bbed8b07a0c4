package batch

// Waiting is how many calls of b wait for a batch (tests only).
func Waiting[Q any](b *Batcher[Q]) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}
