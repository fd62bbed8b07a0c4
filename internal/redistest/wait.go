package redistest

import (
	"testing"
	"time"
)

// Eventually waits until cond holds, failing t after within with what. It
// is for state that sends no word of its change (a counter, a key in Redis,
// a filter's meta): it asks every 2 ms, the one sleep behind every test's
// waits on state.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// Poll is Eventually for a goroutine other than the test's (which must not
// fail t): it reports whether cond held within the time given.
func Poll(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
