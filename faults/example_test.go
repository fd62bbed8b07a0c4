package faults_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/faults"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// A proxy between a client and Redis that freezes the replies.
func ExampleProxy_Blackhole() {
	ctx := context.Background()
	port, _ := redisserver.FreePort(false)
	srv, err := redisserver.Start(ctx, &redisserver.Options{Port: port})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Stop()
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	fmt.Println(rdb.Ping(ctx).Val())

	_ = p.Blackhole()
	ctx2, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	fmt.Println(rdb.Ping(ctx2).Err() != nil)
	// Output:
	// PONG
	// true
}
