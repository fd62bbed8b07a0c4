package guard_test

import (
	"testing"
	"time"
)

// eventually waits until cond holds, failing after within with what. It is
// for state the engine sends no word of (a counter of Stats, a key in
// Redis, a filter's meta): it asks again every 5 ms, the one sleep of the
// waits on state.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond) // polls state that sends no word of its change
	}
}

// waitFor is eventually with 20 s.
func waitFor(t *testing.T, cond func() bool) { eventually(t, 20*time.Second, "condition", cond) }
