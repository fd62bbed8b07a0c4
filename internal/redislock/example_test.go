package redislock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/redislock"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// A lock taken in a pipeline: the commands queued behind the attempt run
// with the lock taken (or not).
func ExampleClient_Queue() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	locks := redislock.New(rdb)

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
