package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestEvictingRedis runs the trial's scenario under each eviction policy:
// two Guards (two processes' worth) over one Redis of 5 MB, 20,000 rows of
// 20 KB (80 MB: the values cannot all fit), known and unknown IDs. No known
// row may answer "not found", whatever Redis evicts; full reads of the ID
// source stay few (the meta is put back, rebuilds back off); an allkeys-*
// policy is warned about at New, a volatile-* one is not.
// docs/benchmarks.md (Eviction) quotes the figures it logs.
func TestEvictingRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("fills Redis to its maxmemory under each eviction policy: make test")
	}
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	for _, policy := range []string{"allkeys-lru", "allkeys-lfu", "volatile-lru", "allkeys-random"} {
		t.Run(policy, func(t *testing.T) {
			_, rdb := redistest.Private(t)
			ctx := context.Background()
			if err := rdb.ConfigSet(ctx, "maxmemory", "5mb").Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
				t.Fatal(err)
			}
			const rows = 20_000
			var scans, unknown, unknownLoads, falseNotFound, wrong, served atomic.Int64
			value := strings.Repeat("x", 20<<10)
			load := func(_ context.Context, id string) (string, error) {
				if id[0] == 'u' {
					unknownLoads.Add(1)
					return "", guard.ErrNotFound
				}
				return id + value, nil
			}
			logs := newLogWatch()
			var gs []*guard.Guard
			for i := range 2 {
				c := redis.NewClient(rdb.Options())
				defer c.Close()
				g, err := guard.New(ctx, c, "user", &guard.Options{Logger: slog.New(logs),
					Filter: guard.FilterOptions{ExpectedItems: 2 * rows, IDs: func(context.Context) iter.Seq2[string, error] {
						scans.Add(1)
						return ids("p", rows)
					}}})
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				if i == 0 {
					waitReady(t, g, 0)
				}
				gs = append(gs, g)
			}
			scans.Store(0)         // the rebuild at New is not the eviction's
			run := 5 * time.Second // CG_EVICTION_RUN=60s gives docs/benchmarks.md its per-minute figures
			if d, err := time.ParseDuration(os.Getenv("CG_EVICTION_RUN")); err == nil {
				run = d
			}
			deadline := time.Now().Add(run)
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g := gs[w%2]
					for n := 0; n < 200_000 && time.Now().Before(deadline); n++ {
						id := fmt.Sprintf("p%d", rand.IntN(rows))
						if n%4 == 0 {
							id = fmt.Sprintf("u%d", rand.IntN(1_000_000))
						}
						v, err := guard.Get(ctx, g, id, load)
						switch {
						case id[0] == 'u':
							unknown.Add(1)
						case errors.Is(err, guard.ErrNotFound):
							falseNotFound.Add(1)
						case err == nil && v != id+value:
							wrong.Add(1)
						case err == nil:
							served.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%s: %d known rows served, %d full ID scans, %d loads of unknown IDs for %d unknown requests, "+
				"%d false not-found, %d wrong", policy, served.Load(), scans.Load(),
				unknownLoads.Load(), unknown.Load(), falseNotFound.Load(), wrong.Load())
			if os.Getenv("CG_EVICTION_LOGS") != "" {
				logs.mu.Lock()
				t.Log(strings.Join(logs.msgs, "\n"))
				logs.mu.Unlock()
			}
			if falseNotFound.Load() != 0 || wrong.Load() != 0 {
				t.Fatalf("%d false not-found, %d wrong values", falseNotFound.Load(), wrong.Load())
			}
			if served.Load() == 0 {
				t.Fatal("no known row was served")
			}
			// Rebuilds back off from 1 s, doubling: across both Guards while
			// Redis keeps the shared key, in each Guard anyway (an allkeys-*
			// Redis evicts that key too): starts at 0, 1, 3, 7... s, so in
			// 5 s at most 3 per Guard.
			if n, most := scans.Load(), 2*(int64(math.Log2(run.Seconds()+1))+1); n > most {
				t.Fatalf("%d full ID scans in %v, want at most %d", n, run, most)
			}
			logs.mu.Lock()
			warned := strings.Contains(strings.Join(logs.msgs, "\n"), "maxmemory-policy "+policy)
			logs.mu.Unlock()
			if warned != strings.HasPrefix(policy, "allkeys-") {
				t.Fatalf("policy %s: warned %v", policy, warned)
			}
		})
	}
}
