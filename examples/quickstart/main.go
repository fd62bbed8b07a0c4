// Command quickstart shows cacheguard's read path against a real redis-server
// that it starts (and stops) itself: a miss, a hit, a bloom-filter reject, an
// empty-value marker and 100 concurrent misses coalesced into one load, with
// the loader calls and Redis round trips each one cost.
//
//	go run ./examples/quickstart            # starts its own redis-server
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/cmdcount"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

type Product struct {
	ID    string
	Name  string
	Price int
}

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) error {
	opts, stop, err := connect(ctx, w)
	if err != nil {
		return err
	}
	defer stop()
	opts.ContextTimeoutEnabled, opts.DialerRetries = true, 1 // deadlines hold when Redis stalls
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	trips := &cmdcount.Counter{}
	rdb.AddHook(trips)

	// The "database": 1,000 products, and a counter of queries.
	var queries atomic.Int64
	db := map[string]Product{}
	for i := range 1000 {
		id := fmt.Sprint(i)
		db[id] = Product{ID: id, Name: "product " + id, Price: 100 + i}
	}
	load := func(ctx context.Context, id string) (Product, error) {
		queries.Add(1)
		time.Sleep(20 * time.Millisecond) // a query that takes a while
		p, ok := db[id]
		if !ok {
			return Product{}, fmt.Errorf("product %s: %w", id, guard.ErrNotFound)
		}
		return p, nil
	}

	name := fmt.Sprintf("quickstart-%d", time.Now().UnixNano())
	g, err := guard.New(ctx, rdb, name, &guard.Options{TTL: time.Minute, Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	if err != nil {
		return err
	}
	defer g.Close()
	defer cleanup(context.WithoutCancel(ctx), rdb, "cg:"+name+":*")
	n, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for id := range db {
			if !yield(id, nil) {
				return
			}
		}
	}, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "bloom filter rebuilt from the database: %d IDs\n\n", n)
	fmt.Fprintf(w, "%-44s %-28s %8s %12s\n", "step", "result", "DB calls", "round trips")

	// A miss answers after its write: each row counts every round trip its
	// Get caused.
	step := func(label, id string) {
		q, t := queries.Load(), trips.RoundTrips()
		p, err := guard.Get(ctx, g, id, load)
		res := fmt.Sprintf("%s, %d", p.Name, p.Price)
		if errors.Is(err, guard.ErrNotFound) {
			res = "ErrNotFound"
		} else if err != nil {
			res = "error: " + err.Error()
		}
		fmt.Fprintf(w, "%-44s %-28s %8d %12d\n", label, res, queries.Load()-q, trips.RoundTrips()-t)
	}
	step("Get 42 (cold: miss, load, cache)", "42")
	step("Get 42 again (hit)", "42")
	step("Get 999999 (unknown: bloom filter rejects)", "999999")
	if err := g.Add(ctx, "1000"); err != nil { // in the filter, not in the DB
		return err
	}
	step("Get 1000 (in filter, not in DB: marker set)", "1000")
	step("Get 1000 again (empty-value marker hit)", "1000")

	q, t := queries.Load(), trips.RoundTrips()
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p, err := guard.Get(ctx, g, "7", load); err == nil && p.ID == "7" {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	fmt.Fprintf(w, "%-44s %-28s %8d %12d\n", "100 goroutines Get 7 at once (cold)",
		fmt.Sprintf("%d got product 7", ok.Load()), queries.Load()-q, trips.RoundTrips()-t)

	st := g.Stats()
	fmt.Fprintf(w, "\nStats: hits %d, misses %d, bloom rejects %d, empty-marker hits %d, coalesced %d, loads %d\n",
		st.Hits, st.Misses, st.BloomRejects, st.EmptyHits, st.Coalesced, st.Loads)
	return nil
}

// connect uses REDIS_URL when set, and otherwise starts a private redis-server.
func connect(ctx context.Context, w io.Writer) (*redis.Options, func(), error) {
	if url := os.Getenv("REDIS_URL"); url != "" {
		o, err := redis.ParseURL(url)
		return o, func() {}, err
	}
	srv, err := redisserver.Start(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(w, "started redis-server (pid %d) on %s\n", srv.PID(), srv.Addr)
	return srv.Options(), func() { _ = srv.Stop() }, nil
}

// cleanup deletes the demo's keys, so a run against a shared Redis leaves
// nothing behind.
func cleanup(ctx context.Context, rdb *redis.Client, pattern string) {
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}
