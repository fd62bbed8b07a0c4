package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// TestRedisRestartWithoutPersistence: Redis is shut down with SHUTDOWN NOSAVE
// and started again on the same port. The Guard (same client, no restart)
// answers every known ID correctly, never a false ErrNotFound, and rejects
// unknown IDs again once the filter is rebuilt: by hand for one Guard, by
// itself (RebuildFrom) for another.
func TestRedisRestartWithoutPersistence(t *testing.T) {
	ctx := context.Background()
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redisserver.Start(ctx, &redisserver.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(srv.Options())
	defer rdb.Close()

	d := newDB(1000)
	source := func(context.Context) iter.Seq2[string, error] { return ids("p", 1000) }
	manual, err := guard.New(ctx, rdb, "manual", &guard.Options{ExpectedItems: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	defer manual.Close()
	auto, err := guard.New(ctx, rdb, "auto", &guard.Options{ExpectedItems: 10_000, RebuildFrom: source})
	if err != nil {
		t.Fatal(err)
	}
	defer auto.Close()
	for _, g := range []*guard.Guard{manual, auto} {
		if _, err := g.Rebuild(ctx, ids("p", 1000), nil); err != nil {
			t.Fatal(err)
		}
	}
	readAll := func(g *guard.Guard) {
		t.Helper()
		for i := range 1000 {
			id := fmt.Sprintf("p%d", i)
			p, err := guard.Get(ctx, g, id, d.load)
			if err != nil || p.ID != id {
				t.Fatalf("%s %s: %+v, %v", g.Name(), id, p, err)
			}
		}
	}
	readAll(manual)
	readAll(auto)

	if err := rdb.ShutdownNoSave(ctx).Err(); err != nil && !errors.Is(err, redis.ErrClosed) {
		t.Logf("shutdown: %v", err) // the connection drops as Redis exits
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("restarted Redis holds %d keys", n)
	}

	// Everything is gone: known IDs are loaded again, never rejected.
	readAll(manual)
	calls := d.calls.Load()
	if _, err := guard.Get(ctx, manual, "unknown-1", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("unknown before rebuild: %v", err)
	}
	if d.calls.Load() != calls+1 {
		t.Fatal("with no filter an unknown ID must reach the loader (fail open)")
	}
	if manual.Stats().BloomBypasses == 0 {
		t.Fatal("bypasses not counted")
	}
	if _, err := manual.Rebuild(ctx, ids("p", 1000), nil); err != nil {
		t.Fatal(err)
	}
	calls = d.calls.Load()
	if _, err := guard.Get(ctx, manual, "unknown-2", d.load); !errors.Is(err, guard.ErrNotFound) || d.calls.Load() != calls {
		t.Fatalf("after Rebuild an unknown ID must be rejected by the filter: %v", err)
	}
	readAll(manual)

	// The other Guard rebuilds by itself once it notices.
	readAll(auto)
	deadline := time.Now().Add(20 * time.Second)
	for {
		in, err := auto.Info(ctx)
		if err == nil && in.Ready {
			t.Logf("auto-rebuilt filter: %+v", in)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("filter not rebuilt automatically: %+v, %v", in, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	calls = d.calls.Load()
	if _, err := guard.Get(ctx, auto, "unknown-3", d.load); !errors.Is(err, guard.ErrNotFound) || d.calls.Load() != calls {
		t.Fatalf("after the automatic rebuild an unknown ID must be rejected: %v", err)
	}
	readAll(auto)
}

// TestSaturationHook: adding far more IDs than the filter was sized for
// fires OnBloomSaturated once.
func TestSaturationHook(t *testing.T) {
	ctx := context.Background()
	fired := make(chan float64, 10)
	_, g, _ := setup(t, 0, &guard.Options{ExpectedItems: 1000, OnBloomSaturated: func(s bloom.Saturation) { fired <- s.EstimatedFPRate }})
	for i := range 30 {
		batch := make([]string, 100)
		for j := range batch {
			batch[j] = fmt.Sprintf("n%d-%d", i, j)
		}
		if err := g.Add(ctx, batch...); err != nil {
			t.Fatal(err)
		}
	}
	if len(fired) != 1 {
		t.Fatalf("hook fired %d times, want once", len(fired))
	}
	if est := <-fired; est <= 0.015 {
		t.Fatalf("estimated FP %.4f not above the 1.5%% threshold", est)
	}
}
