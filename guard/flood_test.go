package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// floodCounts is what callers met during one incident, from its start until
// the filter answered again.
type floodCounts struct {
	unknown, unknownLoaded                atomic.Int64
	known, knownValue, known503, known404 atomic.Int64
	knownOther                            atomic.Int64
	took                                  time.Duration
}

// TestFloodThroughIncidents is the flood of docs/benchmarks.md (Incidents): 64 callers,
// 90% of them asking for IDs that do not exist, against a Guard whose
// loader and ID source are as slow as a SELECT (1.5 ms a call; 2 ms per
// 1,000 IDs streamed), through an empty restart of Redis (the filter lost,
// rebuilt from Filter.IDs) and a 3 s freeze (SIGSTOP). It runs with the
// filter's copy and without (NoLocalCopy, the code before), logs the table
// (go test -run TestFloodThroughIncidents -v ./guard), and holds the goal:
// with the copy at most 1% of the unknown IDs reach the loader; no known ID
// is answered ErrNotFound. Control: without the copy, more than 1% do.
func TestFloodThroughIncidents(t *testing.T) {
	if testing.Short() {
		t.Skip("floods two incidents for 15 s")
	}
	var rows []string
	for _, noCopy := range []bool{true, false} {
		restart, freeze := flood(t, noCopy)
		name := "copy"
		if noCopy {
			name = "NoLocalCopy (before)"
		}
		for _, r := range []struct {
			what string
			n    *floodCounts
		}{{"empty restart", restart}, {"freeze 3 s", freeze}} {
			n := r.n
			share := float64(n.unknownLoaded.Load()) / float64(max(n.unknown.Load(), 1))
			rows = append(rows, fmt.Sprintf("| %s | %s | %v | %d | %d (%.2f%%) | %d | %d | %d | %d | %d |", name, r.what,
				n.took.Round(time.Millisecond), n.unknown.Load(), n.unknownLoaded.Load(), 100*share,
				n.known.Load(), n.knownValue.Load(), n.known503.Load(), n.known404.Load(), n.knownOther.Load()))
			switch {
			case n.known404.Load() != 0:
				t.Errorf("%s, %s: %d known IDs answered ErrNotFound", name, r.what, n.known404.Load())
			case !noCopy && share > 0.01:
				t.Errorf("%s, %s: %.2f%% of the unknown IDs loaded, want at most 1%%", name, r.what, 100*share)
			case noCopy && share <= 0.01:
				t.Errorf("control: %s, %s: %.2f%% of the unknown IDs loaded without the copy, want more than 1%%: "+
					"the flood proves nothing", name, r.what, 100*share)
			}
		}
	}
	t.Logf("\n| Guard | incident | until the filter answered | unknown Gets | unknown IDs loaded | known Gets | value | 503 | ErrNotFound | other |\n"+
		"|---|---|---|---|---|---|---|---|---|---|\n%s", strings.Join(rows, "\n"))
}

// flood runs the workload through an empty restart, then a freeze.
func flood(t *testing.T, noCopy bool) (restart, freeze *floodCounts) {
	ctx := context.Background()
	srv, _ := redistest.Private(t)
	o := srv.Options()
	o.ContextTimeoutEnabled, o.DialerRetries = true, 1 // docs/usage.md's client
	rdb := redis.NewClient(o)
	defer rdb.Close()
	const known = 100_000
	source := func(ctx context.Context) iter.Seq2[string, error] {
		return func(yield func(string, error) bool) {
			for i := range known {
				if i%1000 == 0 {
					time.Sleep(2 * time.Millisecond)
				}
				if !yield(fmt.Sprintf("k%d", i), nil) {
					return
				}
			}
		}
	}
	g, err := guard.New(ctx, rdb, "flood", &guard.Options{
		Filter: guard.FilterOptions{ExpectedItems: 2 * known, IDs: source, NoLocalCopy: noCopy},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	waitFor(t, func() bool { in, err := g.Info(ctx); return err == nil && in.Ready })
	waitFor(t, func() bool { return noCopy || g.Stats().FilterCopy > 0 })

	var cur atomic.Pointer[floodCounts] // the incident under way, or nil
	load := func(ctx context.Context, id string) (string, error) {
		time.Sleep(1500 * time.Microsecond)
		if n := cur.Load(); n != nil && id[0] == 'u' {
			n.unknownLoaded.Add(1)
		}
		if id[0] == 'u' {
			return "", guard.ErrNotFound
		}
		return "v" + id, nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				unknown := rand.IntN(10) != 0
				id := fmt.Sprintf("k%d", rand.IntN(known))
				if unknown {
					id = fmt.Sprintf("u%d", rand.Uint64())
				}
				c, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
				v, err := guard.Get(c, g, id, load)
				cancel()
				n := cur.Load()
				switch {
				case n == nil:
				case unknown:
					n.unknown.Add(1)
				default:
					n.known.Add(1)
					switch {
					case err == nil && v == "v"+id:
						n.knownValue.Add(1)
					case errors.Is(err, guard.ErrNotFound):
						n.known404.Add(1)
					case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
						n.known503.Add(1)
					default:
						n.knownOther.Add(1)
					}
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	// The filter answers again when an unknown ID is rejected by it.
	back := func() bool {
		c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		maybe, err := g.MayExist(c, fmt.Sprintf("probe-%d", rand.Uint64()))
		return err == nil && !maybe
	}
	incident := func(hit func(), heal func()) *floodCounts {
		time.Sleep(time.Second) // traffic before the fault
		n := &floodCounts{}
		began := time.Now()
		cur.Store(n)
		hit()
		heal()
		for !back() {
			time.Sleep(5 * time.Millisecond)
		}
		cur.Store(nil)
		n.took = time.Since(began)
		return n
	}
	restart = incident(func() {
		if err := rdb.ShutdownNoSave(ctx).Err(); err != nil && !errors.Is(err, redis.ErrClosed) {
			t.Logf("shutdown: %v", err)
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}, func() {})
	freeze = incident(func() {
		if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
	}, func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) })
	return restart, freeze
}
