package loader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
)

// TestMain checks that no goroutine outlives the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

// TestTimeoutBoundsFlight: Timeout, set before first use, ends the
// flight's ctx (the engine's tests are internal/flightgroup's).
func TestTimeoutBoundsFlight(t *testing.T) {
	g := loader.Group[int, int]{Timeout: 20 * time.Millisecond}
	_, _, err := g.Do(context.Background(), 1, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
}
