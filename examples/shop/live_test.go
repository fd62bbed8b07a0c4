package main

import (
	"testing"
	"time"
)

// TestLatencyHistogram: the p99 of known latencies, within a bucket (10%).
func TestLatencyHistogram(t *testing.T) {
	var h latencies
	for i := 1; i <= 1000; i++ { // 1 ms .. 1000 ms: p99 is 990 ms
		h.add(time.Duration(i) * time.Millisecond)
	}
	n, p99 := h.drain()
	if n != 1000 || p99 < 990*time.Millisecond || p99 > 1100*time.Millisecond {
		t.Fatalf("n %d, p99 %v, want 1000 and 990 ms (+10%%)", n, p99)
	}
	if n, p99 := h.drain(); n != 0 || p99 != 0 {
		t.Fatalf("after a drain: %d %v", n, p99)
	}
	h.add(0)
	h.add(time.Hour) // both ends land in a bucket
	if n, _ := h.drain(); n != 2 {
		t.Fatalf("extremes: %d", n)
	}
}
