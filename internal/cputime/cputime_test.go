package cputime_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/cputime"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestRedisCPUGrowsWithWork: the server's CPU time is read, and it grows
// while the server works.
func TestRedisCPUGrowsWithWork(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	var on redis.UniversalClient = c // the node the SETs run on: on a cluster, the key's master alone
	if cc, ok := c.UniversalClient.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, c.Prefix+":k")
		if err != nil {
			t.Fatal(err)
		}
		on = m
	}
	before, err := cputime.Redis(ctx, on)
	if err != nil {
		t.Fatal(err)
	}
	if before <= 0 {
		t.Fatalf("redis-server CPU %v, want > 0", before)
	}
	for i := 0; i < 200; i++ {
		pipe := c.Pipeline()
		for j := 0; j < 100; j++ {
			pipe.Set(ctx, c.Prefix+":k", j, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after, err := cputime.Redis(ctx, on)
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("redis-server CPU %v after 20,000 SETs, %v before", after, before)
	}
}

// TestProcessCPUGrowsWithWork: this process's CPU time grows while it
// computes.
func TestProcessCPUGrowsWithWork(t *testing.T) {
	before := cputime.Process()
	x := uint64(1)
	for cputime.Process() == before {
		for i := 0; i < 1_000_000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	if after := cputime.Process(); after <= before || x == 0 {
		t.Fatalf("process CPU %v, then %v", before, after)
	}
}
