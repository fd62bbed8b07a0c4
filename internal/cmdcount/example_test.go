package cmdcount_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/cmdcount"
)

func Example() {
	// The hook counts what is sent, whether or not a server answers.
	rdb := redis.NewClient(&redis.Options{Network: "unix", Addr: "/nonexistent/redis.sock", MaxRetries: -1})
	defer rdb.Close()
	var c cmdcount.Counter
	rdb.AddHook(&c)

	ctx := context.Background()
	_ = rdb.Get(ctx, "a").Err()
	pipe := rdb.Pipeline()
	pipe.Get(ctx, "b")
	pipe.GetRange(ctx, "c", 0, 63)
	_, _ = pipe.Exec(ctx)

	fmt.Println(c.RoundTrips(), c.Commands(), c.Names()["get"])
	// Output: 2 3 2
}
