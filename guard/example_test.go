package guard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

type Product struct {
	ID    string
	Name  string
	Price int
}

func ExampleGet() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()

	// Stands in for the database.
	products := map[string]Product{"42": {ID: "42", Name: "Desk lamp", Price: 1999}}
	loadProduct := func(ctx context.Context, id string) (Product, error) {
		p, ok := products[id]
		if !ok {
			return Product{}, guard.ErrNotFound // or fmt.Errorf("...: %w", guard.ErrNotFound)
		}
		return p, nil
	}

	g, err := guard.New(ctx, rdb, "example-product", nil) // nil: default options
	if err != nil {
		panic(err)
	}
	defer g.Close()
	// Fill the bloom filter from the database once (usually a SELECT id scan).
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for id := range products {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		panic(err)
	}

	p, err := guard.Get(ctx, g, "42", loadProduct) // miss: loads and caches
	fmt.Println(p.Name, err)
	p, err = guard.Get(ctx, g, "42", loadProduct) // hit: one round trip
	fmt.Println(p.Name, err)
	_, err = guard.Get(ctx, g, "does-not-exist", loadProduct) // the bloom filter says no
	fmt.Println(errors.Is(err, guard.ErrNotFound))

	st := g.Stats()
	fmt.Println("hits:", st.Hits, "loads:", st.Loads, "bloom rejects:", st.BloomRejects)
	// Output:
	// Desk lamp <nil>
	// Desk lamp <nil>
	// true
	// hits: 1 loads: 1 bloom rejects: 1
}

func ExampleGuard_Invalidate() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-price", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	price := 100
	load := func(ctx context.Context, id string) (int, error) { return price, nil }
	_ = g.Add(ctx, "sku-1") // a new row, after the INSERT committed

	v, _ := guard.Get(ctx, g, "sku-1", load)
	fmt.Println(v)

	price = 120                    // UPDATE ... committed
	_ = g.Invalidate(ctx, "sku-1") // then drop the cached copy
	v, _ = guard.Get(ctx, g, "sku-1", load)
	fmt.Println(v)
	// Output:
	// 100
	// 120
}
