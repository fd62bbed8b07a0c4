package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/lock"
)

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

// A lock taken in a pipeline: the commands queued behind the attempt run
// with the lock taken (or not).
func ExampleClient_Queue() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	locks := lock.New(rdb)

	pipe := rdb.Pipeline()
	q, err := locks.Queue(ctx, pipe, "example:{report-7}:lock", 5*time.Second)
	if err != nil {
		panic(err)
	}
	cached := pipe.Get(ctx, "example:{report-7}") // runs after the attempt
	_, _ = pipe.Exec(ctx)
	l, err := q.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(l.Token()), cached.Err())
	fmt.Println(l.Release(ctx))
	// Output:
	// 32 redis: nil
	// <nil>
}
