// Command missfiles lists the library files one plain miss runs through:
// built with coverage (scripts/miss-files.sh), it opens a Guard on a
// private redis-server, warms it with hits and misses, clears the coverage
// counters, makes one Get of a known ID that is not cached, and writes the
// counters for the script to list the files with a statement executed
// (scripts/miss-walk.sh traces the same Get with Delve).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/coverage"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

type product struct {
	ID    string
	Price int
}

func main() {
	if err := run(context.Background(), os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "missfiles:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir string) error {
	srv, err := redisserver.Start(ctx, nil)
	if err != nil {
		return err
	}
	defer srv.Stop()
	rdb := redis.NewClient(srv.Options())
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "missfiles", &guard.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer g.Close()
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for _, id := range ids {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		return err
	}
	load := func(_ context.Context, id string) (product, error) { return product{ID: id, Price: 1}, nil }
	for _, id := range ids[:50] { // warm: misses, then hits, then rejects
		for range 2 {
			if _, err := guard.Get(ctx, g, id, load); err != nil {
				return err
			}
		}
		_, _ = guard.Get(ctx, g, "unknown-"+id, load)
	}
	if err := coverage.ClearCounters(); err != nil {
		return err
	}
	err = plainMiss(ctx, g, ids[77], load)
	after()
	if err != nil {
		return err
	}
	if err := coverage.WriteMetaDir(dir); err != nil {
		return err
	}
	return coverage.WriteCountersDir(dir)
}

// plainMiss is the plain miss; scripts/miss-walk.sh traces the calls
// between its start and after's.
//
//go:noinline
func plainMiss(ctx context.Context, g *guard.Guard, id string, load guard.LoadFunc[product]) error {
	_, err := guard.Get(ctx, g, id, load)
	return err
}

//go:noinline
func after() {}
