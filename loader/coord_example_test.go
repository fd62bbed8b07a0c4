package loader_test

import (
	"context"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
)

// One Run: the lock, the re-check, the load, the checked write.
func ExampleCoordinator_Run() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	c := loader.NewCoordinator(rdb, "example:loaded", nil)
	defer c.Close()
	key := fmt.Sprintf("example:{k-%d}", time.Now().UnixNano())
	_, err := c.Run(ctx, key, "v1", nil, filler(func(context.Context) ([]byte, time.Duration, error) {
		return []byte("loaded"), time.Minute, nil
	}))
	fmt.Println(err, rdb.HGet(ctx, key, "v1").Val())
	// Output: <nil> loaded
}
