package redisserver_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

func Example() {
	ctx := context.Background()
	srv, err := redisserver.Start(ctx, nil) // a unix socket in a fresh temp dir
	if err != nil {
		panic(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(srv.Options())
	defer rdb.Close()
	fmt.Println(rdb.Ping(ctx).Val(), srv.Network)
	// Output: PONG unix
}
