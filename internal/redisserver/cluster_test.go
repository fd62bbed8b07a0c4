package redisserver_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster: make test")
	}
	ctx := context.Background()
	c, err := redisserver.StartCluster(ctx, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	masters, err := c.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters %d, %v", len(masters), err)
	}
	rdb := redis.NewClusterClient(c.Options())
	defer rdb.Close()
	for i := range 100 {
		if err := rdb.Set(ctx, fmt.Sprint("k", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The keys spread over the masters.
	var spread atomic.Int32 // ForEachMaster calls in parallel
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if m.DBSize(ctx).Val() > 0 {
			spread.Add(1)
		}
		return nil
	})
	if err != nil || spread.Load() != 3 {
		t.Fatalf("keys on %d masters, %v", spread.Load(), err)
	}
}
