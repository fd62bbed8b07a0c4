package loader_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
)

// TestCoordinatorOneLoadManyCoordinators: several Coordinators (as in several
// processes) fill one key; the load runs once and the rest wake on the publish.
func TestCoordinatorOneLoadManyCoordinators(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	key := c.Prefix + ":{k}"
	var loads, wakeups atomic.Int32
	var filled atomic.Bool
	check := func(context.Context, redis.Pipeliner) func() (bool, error) {
		return func() (bool, error) { return filled.Load(), nil }
	}
	load := func(ctx context.Context, fence int64) error {
		if fence <= 0 {
			t.Errorf("fence %d", fence)
		}
		loads.Add(1)
		time.Sleep(50 * time.Millisecond)
		filled.Store(true)
		return nil
	}
	var wg sync.WaitGroup
	for range 8 {
		co := loader.NewCoordinator(redistest.Connect(t).UniversalClient, c.Prefix+":ch", nil)
		defer co.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := co.Run(ctx, key, check, load); err != nil {
				t.Error(err)
			}
			wakeups.Add(int32(co.Stats().Wakeups))
		}()
	}
	wg.Wait()
	if loads.Load() != 1 {
		t.Fatalf("%d loads, want 1", loads.Load())
	}
	if wakeups.Load() == 0 {
		t.Fatal("no waiter was woken by the publish")
	}
	if n := c.Exists(ctx, key+":lock").Val(); n != 0 {
		t.Fatal("lock left behind")
	}
}

func TestCoordinatorReleasesOnPanicAndError(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	co := loader.NewCoordinator(c.UniversalClient, c.Prefix+":ch", nil)
	defer co.Close()
	key := c.Prefix + ":{k}"
	no := func(context.Context, redis.Pipeliner) func() (bool, error) {
		return func() (bool, error) { return false, nil }
	}
	func() {
		defer func() { _ = recover() }()
		_ = co.Run(ctx, key, no, func(context.Context, int64) error { panic("boom") })
	}()
	if pttl := c.PTTL(ctx, key+":lock").Val(); pttl != -2 {
		t.Fatalf("after a panic the lock has PTTL %v, want -2", pttl)
	}
	boom := errors.New("db down")
	if err := co.Run(ctx, key, no, func(context.Context, int64) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if n := c.Exists(ctx, key+":lock").Val(); n != 0 {
		t.Fatal("lock left behind after an error")
	}
	// Fence lost: Run loads again with a newer fence.
	var fences []int64
	err := co.Run(ctx, key, no, func(_ context.Context, fence int64) error {
		fences = append(fences, fence)
		if len(fences) < 3 {
			return loader.ErrFenceLost
		}
		return nil
	})
	if err != nil || len(fences) != 3 || !(fences[0] < fences[1] && fences[1] < fences[2]) {
		t.Fatalf("err %v, fences %v", err, fences)
	}
	if err := co.Close(); err != nil {
		t.Fatal(err)
	}
}
