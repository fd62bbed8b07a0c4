package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/lock"
)

// TestOneWinnerOutOfHundred: 100 goroutines obtain one key at once through
// the public Client: exactly one gets it. (internal/redislock tests the
// rest of the lock against Redis.)
func TestOneWinnerOutOfHundred(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	locks := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	var winners, losers atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 100 {
		wg.Go(func() {
			<-start
			_, err := locks.Obtain(ctx, key, time.Minute, nil)
			switch {
			case err == nil:
				winners.Add(1)
			case errors.Is(err, lock.ErrNotObtained):
				losers.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if winners.Load() != 1 || losers.Load() != 99 {
		t.Fatalf("%d winners, %d losers; want 1 and 99", winners.Load(), losers.Load())
	}
}

// TestTakeOver: once a lock is released, another holder gets it and the
// first can neither refresh nor release it (TestWatchdogOutlivesTTL keeps
// one past its TTL).
func TestTakeOver(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	locks := lock.New(c)
	key := c.Prefix + ":{k}:lock"
	l, err := locks.Obtain(ctx, key, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := locks.Obtain(ctx, key, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("refresh of another's lock: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release of another's lock: %v", err)
	}
	if got := c.Get(ctx, key).Val(); got != other.Token() {
		t.Fatal("the other holder's lock was touched")
	}
}
