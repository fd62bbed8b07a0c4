package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/lock"
)

// Obtain, keep alive while working, release.
func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	locks := lock.New(rdb)

	// The hash tag keeps the lock in the slot of what it guards.
	l, err := locks.Obtain(ctx, "example:{report-42}:lock", 5*time.Second, nil)
	if err != nil {
		panic(err)
	}
	stop := l.KeepAlive(ctx, 5*time.Second, func(err error) { fmt.Println("lost:", err) })

	_, err = locks.Obtain(ctx, "example:{report-42}:lock", time.Second, nil)
	fmt.Println(errors.Is(err, lock.ErrNotObtained))

	// ... work; a write that must not land after the lock expired checks
	// l.Token() against the lock key in the same script ...
	stop()
	fmt.Println(l.Release(ctx))
	fmt.Println(errors.Is(l.Release(ctx), lock.ErrNotHeld))
	// Output:
	// true
	// <nil>
	// true
}

// Waiting for a holder: Obtain retries until Options.Wait runs out.
func ExampleClient_Obtain() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	locks := lock.New(rdb)

	holder, _ := locks.Obtain(ctx, "example:{report-8}:lock", 50*time.Millisecond, nil) // lapses in 50ms
	l, err := locks.Obtain(ctx, "example:{report-8}:lock", time.Second, &lock.Options{Wait: time.Second})
	fmt.Println(err, l.Token() != holder.Token())
	_ = l.Release(ctx)
	// Output:
	// <nil> true
}

// A lock whose TTL ran out is no longer the holder's: Refresh says so.
func ExampleLock_Refresh() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	l, _ := lock.New(rdb).Obtain(ctx, "example:{report-9}:lock", time.Second, nil)
	fmt.Println(l.Refresh(ctx, 300*time.Millisecond)) // held: its TTL is now 300ms
	time.Sleep(600 * time.Millisecond)                // past the 300ms TTL: an example shows expiry by waiting it out
	fmt.Println(errors.Is(l.Refresh(ctx, time.Second), lock.ErrNotHeld))
	_, err := lock.New(rdb).Obtain(ctx, "", time.Second, nil)
	fmt.Println(errors.Is(err, lock.ErrInvalid), errors.Is(err, lock.ErrUnavailable))
	// Output:
	// <nil>
	// true
	// true false
}
