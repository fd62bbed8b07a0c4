package guard_test

import (
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// eventually waits until cond holds, failing after within with what: for
// state the engine sends no word of (a counter of Stats, a key in Redis,
// a filter's meta). See redistest.Eventually.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	redistest.Eventually(t, within, what, cond)
}

// waitFor is eventually with 20 s.
func waitFor(t *testing.T, cond func() bool) { eventually(t, 20*time.Second, "condition", cond) }

// Where a test's goroutines wait inside the engine (redistest.Parked): a
// caller that joined a flight under way, one that joined a shared read, a
// read queued for a round trip. A flight's first caller whose ctx can end
// waits in DoOnJoin too: the tests that count joins start it on
// context.Background(), so that it runs the flight in its own goroutine.
// The leader of a shared or detached read batch waits in await too: the
// tests that count queued reads hold reads that run alone, in their
// callers' goroutines (ctx without a deadline).
const (
	inGroup = "loader.(*Group[...]).DoOnJoin"
	inBatch = "batch.(*Batcher[...]).await"
)

// joinedFlights is how many of root's goroutines joined a flight under way.
func joinedFlights(root int) int { return redistest.Parked(root, inGroup, "guard.(*call[...]).join") }

// joinedReads is how many of root's goroutines joined a shared read.
func joinedReads(root int) int { return redistest.Parked(root, inGroup, "guard.(*Guard).readShared") }

// readsWaiting is how many of root's reads wait for a round trip (see runReads).
func readsWaiting(root int) int { return redistest.Parked(root, inBatch, "guard.(*Guard).sendRead") }

// waitJoined waits until n of the calling goroutine's goroutines joined a
// flight under way.
func waitJoined(t *testing.T, n int) {
	t.Helper()
	redistest.WaitParked(t, n, inGroup, "guard.(*call[...]).join")
}
