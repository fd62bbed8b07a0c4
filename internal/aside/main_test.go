package aside

import (
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestMain starts the private redis-server the benchmarks use and checks
// that no goroutine outlives the tests.
func TestMain(m *testing.M) { redistest.Main(m) }
