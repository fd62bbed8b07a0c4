package cputime_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/cputime"
)

// The CPU a piece of work costs per operation, in this process and in
// redis-server: read both before and after, divide by the operations.
func ExampleRedis() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	const ops = 1000
	server0, err := cputime.Redis(ctx, rdb)
	if err != nil {
		fmt.Println(err)
		return
	}
	client0 := cputime.Process()
	for i := range ops {
		rdb.Get(ctx, fmt.Sprint("product:", i))
	}
	server1, err := cputime.Redis(ctx, rdb)
	if err != nil {
		fmt.Println(err)
		return
	}
	client := (cputime.Process() - client0) / ops
	server := (server1 - server0) / ops
	fmt.Printf("per GET: %v client + %v Redis\n", client.Round(time.Microsecond/10), server.Round(time.Microsecond/10))
}

func ExampleProcess() {
	fmt.Println(cputime.Process() > 0)
	// Output: true
}
