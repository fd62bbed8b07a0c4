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
