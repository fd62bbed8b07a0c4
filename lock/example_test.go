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

	// The hash tag keeps the lock and its fence key in one cluster slot.
	l, err := locks.Obtain(ctx, "example:{report-42}:lock", 5*time.Second, nil)
	if err != nil {
		panic(err)
	}
	stop := l.KeepAlive(ctx, 5*time.Second, func(err error) { fmt.Println("lost:", err) })

	_, err = locks.Obtain(ctx, "example:{report-42}:lock", time.Second, nil)
	fmt.Println(errors.Is(err, lock.ErrNotObtained))

	// ... work, writing l.Fence() along with the result ...
	stop()
	fmt.Println(l.Release(ctx))
	fmt.Println(errors.Is(l.Release(ctx), lock.ErrNotHeld))
	// Output:
	// true
	// <nil>
	// true
}

// A lock taken in a pipeline without a fence: the commands queued behind
// the attempt run with the lock taken (or not), and the holder's write
// proves its hold with the token (see the package doc).
func ExampleClient_QueueUnfenced() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	locks := lock.New(rdb)

	pipe := rdb.Pipeline()
	q, err := locks.QueueUnfenced(ctx, pipe, "example:{report-7}:lock", 5*time.Second)
	if err != nil {
		panic(err)
	}
	cached := pipe.Get(ctx, "example:{report-7}") // runs after the attempt
	_, _ = pipe.Exec(ctx)
	l, err := q.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(l.Fence(), cached.Err())
	fmt.Println(l.Release(ctx))
	// Output:
	// 0 redis: nil
	// <nil>
}
