package redisserver_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// TestMain checks first for what the examples run, which cannot fail but
// by a panic: without it, one line says what to install.
func TestMain(m *testing.M) {
	if err := redisserver.Need("redis-server", "redis-sentinel"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

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

// A master, one replica and three Sentinels; a failover client follows the
// master the Sentinels name.
func ExampleStartReplicated() {
	ctx := context.Background()
	set, err := redisserver.StartReplicated(ctx, "cg", 1, 3)
	if err != nil {
		panic(err)
	}
	defer set.Stop()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: set.Name, SentinelAddrs: set.SentinelAddrs()})
	defer rdb.Close()
	fmt.Println(rdb.Set(ctx, "k", "v", 0).Err(), len(set.Sentinels))
	// Output: <nil> 3
}
