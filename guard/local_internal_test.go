package guard

import (
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/pubsub"
)

// TestLocalCopyCountsFromBeforeTheRoundTrip: a copy of an entry whose
// Redis TTL was read (or written) 250 ms after the clock was read before
// its round trip ends when Redis's count would: 300 ms after that clock
// read at the latest, never 300 ms after the put. (Before, put counted the
// TTL from itself: a put delayed after its round trip outlived the entry.)
func TestLocalCopyCountsFromBeforeTheRoundTrip(t *testing.T) {
	l, err := newLocal(LocalOptions{TTL: time.Minute}, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	defer l.c.StopAllGoroutines()
	l.sub.Store(new(pubsub.Subscription)) // armed, without Redis (never closed: it has no connection)
	since := time.Now().Add(-250 * time.Millisecond)
	l.put("p1", []byte("v"), nil, 300*time.Millisecond, since, l.epoch.Load())
	e, st := l.get("p1")
	if st != localFresh {
		t.Fatalf("state %v, want a fresh copy", st)
	}
	// until is wall-clock nanoseconds, since's difference a monotonic one:
	// the two clocks may drift by nanoseconds between readings, not by ms.
	if latest := since.Add(300*time.Millisecond + time.Millisecond).UnixNano(); !e.gone || e.until > latest {
		t.Fatalf("the copy lives until %v, past its entry's end %v (gone %v)", time.Unix(0, e.until), time.Unix(0, latest), e.gone)
	}
	l.put("p2", []byte("v"), nil, 300*time.Millisecond, time.Now().Add(-time.Second), l.epoch.Load())
	if _, st := l.get("p2"); st != localNone {
		t.Fatalf("a copy whose entry has already expired was kept (%v)", st)
	}
}
