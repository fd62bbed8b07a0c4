package bloom_test

import (
	"context"
	"fmt"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()

	f, err := bloom.Open(ctx, rdb, "example:users:bf", &bloom.Options{
		ExpectedItems: 100_000, FalsePositiveRate: 0.01,
	})
	if err != nil {
		panic(err)
	}
	// Until a rebuild has loaded every existing ID, the filter refuses to
	// say "absent".
	_, err = f.Test(ctx, "u1")
	fmt.Println(err)

	// Load the IDs from the source of truth (here a slice; usually a DB scan).
	existing := []string{"u1", "u2", "u3"}
	n, err := f.Rebuild(ctx, func(yield func(string, error) bool) {
		for _, id := range existing {
			if !yield(id, nil) {
				return
			}
		}
	}, nil)
	fmt.Println(n, err)

	_ = f.Add(ctx, "u4") // a new user, after the DB commit
	maybe, _ := f.TestMany(ctx, []string{"u2", "u4", "nobody"})
	fmt.Println(maybe)
	cfg := f.Config()
	fmt.Println(cfg.Bits, cfg.Hashes)
	// Output:
	// bloom: filter not ready
	// 3 <nil>
	// [true true false]
	// 1008640 7
}
