package redistest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestMain is how a package gets its redis-server (and, with
// CG_TEST_CLUSTER=1, a Redis Cluster instead).
func TestMain(m *testing.M) { redistest.Main(m) }

func TestConnectCounts(t *testing.T) {
	c := redistest.Connect(t)
	ctx := context.Background()
	c.Set(ctx, c.Prefix+":a", "1", 0)
	pipe := c.Pipeline()
	pipe.Get(ctx, c.Prefix+":a")
	pipe.Get(ctx, c.Prefix+":b")
	_, _ = pipe.Exec(ctx)
	if c.Counter.RoundTrips() != 2 || c.Counter.Commands() != 3 {
		t.Fatalf("%d round trips, %d commands: %v", c.Counter.RoundTrips(), c.Counter.Commands(), c.Counter.Names())
	}
	keys, err := c.AllKeys(ctx, c.Prefix+":*")
	if err != nil || len(keys) != 1 {
		t.Fatalf("AllKeys: %v %v", keys, err)
	}
}

func Example() {
	// In a test: c := redistest.Connect(t) gives a counted client and a key
	// prefix of the test's own. Examples build a client of their own:
	rdb := redistest.NewClient()
	defer rdb.Close()
	fmt.Println(rdb.Ping(context.Background()).Val())
	// Output: PONG
}
