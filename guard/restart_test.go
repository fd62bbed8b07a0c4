package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestRedisRestartWithoutPersistence: Redis is shut down with SHUTDOWN NOSAVE
// and started again on the same port. The Guard (same client, no restart)
// answers every known ID correctly, never a false ErrNotFound, and rejects
// unknown IDs again once the filter is rebuilt: by hand for one Guard, by
// itself (RebuildFrom) for another.
func TestRedisRestartWithoutPersistence(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redisserver.Start(ctx, &redisserver.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(srv.Options())
	defer rdb.Close()

	d := newDB(1000)
	source := func(context.Context) iter.Seq2[string, error] { return ids("p", 1000) }
	// Without the filter's copy: it would answer unknown IDs ErrUnconfirmed
	// while the filter is lost (TestCopyThroughIncidents).
	manual, err := guard.New(ctx, rdb, "manual", &guard.Options{Filter: guard.FilterOptions{ExpectedItems: 10_000, NoLocalCopy: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer manual.Close()
	auto, err := guard.New(ctx, rdb, "auto", &guard.Options{Filter: guard.FilterOptions{ExpectedItems: 10_000, IDs: source}})
	if err != nil {
		t.Fatal(err)
	}
	defer auto.Close()
	for _, g := range []*guard.Guard{manual, auto} {
		if _, err := g.Rebuild(ctx, ids("p", 1000), nil); err != nil {
			t.Fatal(err)
		}
	}
	readAll := func(g *guard.Guard) {
		t.Helper()
		for i := range 1000 {
			id := fmt.Sprintf("p%d", i)
			p, err := guard.Get(ctx, g, id, d.load)
			if err != nil || p.ID != id {
				t.Fatalf("%s %s: %+v, %v", g.Name(), id, p, err)
			}
		}
	}
	readAll(manual)
	readAll(auto)

	if err := rdb.ShutdownNoSave(ctx).Err(); err != nil && !errors.Is(err, redis.ErrClosed) {
		t.Logf("shutdown: %v", err) // the connection drops as Redis exits
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("restarted Redis holds %d keys", n)
	}

	// Everything is gone: known IDs are loaded again, never rejected.
	readAll(manual)
	calls := d.calls.Load()
	if _, err := guard.Get(ctx, manual, "unknown-1", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("unknown before rebuild: %v", err)
	}
	if d.calls.Load() != calls+1 {
		t.Fatal("with no filter an unknown ID must reach the loader (fail open)")
	}
	if st := manual.Stats(); st.BloomBypasses == 0 || !st.FilterNotReady {
		t.Fatalf("bypasses not counted, or the filter not reported down: %+v", st)
	}
	if _, err := manual.Rebuild(ctx, ids("p", 1000), nil); err != nil {
		t.Fatal(err)
	}
	calls = d.calls.Load()
	if _, err := guard.Get(ctx, manual, "unknown-2", d.load); !errors.Is(err, guard.ErrNotFound) || d.calls.Load() != calls {
		t.Fatalf("after Rebuild an unknown ID must be rejected by the filter: %v", err)
	}
	if manual.Stats().FilterNotReady {
		t.Fatal("the filter answers again and is still reported down")
	}
	readAll(manual)

	// The other Guard rebuilds by itself once it notices, retrying until
	// Redis takes the upload (the first attempts may find the client's
	// connections still failing).
	noticed := time.Now()
	readAll(auto)
	eventually(t, 20*time.Second, "the filter rebuilt automatically", func() bool {
		in, err := auto.Info(ctx)
		return err == nil && in.Ready
	})
	t.Logf("auto-rebuilt filter %v after the first Get found it gone", time.Since(noticed))
	calls = d.calls.Load()
	if _, err := guard.Get(ctx, auto, "unknown-3", d.load); !errors.Is(err, guard.ErrNotFound) || d.calls.Load() != calls {
		t.Fatalf("after the automatic rebuild an unknown ID must be rejected: %v", err)
	}
	readAll(auto)
}

// TestSaturationWarning: adding far more IDs than the filter was sized for
// logs one warning with the estimated rate.
func TestSaturationWarning(t *testing.T) {
	ctx := context.Background()
	var logs redistest.Logs
	_, g, _ := setup(t, 0, &guard.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Filter: guard.FilterOptions{ExpectedItems: 1000}})
	for i := range 30 {
		batch := make([]string, 100)
		for j := range batch {
			batch[j] = fmt.Sprintf("n%d-%d", i, j)
		}
		if err := g.Add(ctx, batch...); err != nil {
			t.Fatal(err)
		}
	}
	var est float64
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg string  `json:"msg"`
			Est float64 `json:"estimated_fp_rate"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && strings.Contains(rec.Msg, "saturated") {
			n, est = n+1, rec.Est
		}
	}
	if n != 1 || est <= 0.015 {
		t.Fatalf("%d saturation warnings (estimate %v), want one above 0.015:\n%s", n, est, logs.String())
	}
}

// TestFilterStuckSequenceHeals: Redis loses everything, then an Add comes
// before any Get (on an earlier version this left a partial meta: Rebuild,
// auto-rebuild and New failed with ErrMismatch, and every unknown ID reached
// the loader for good). Now a process with an ID source heals it by itself,
// and a process without one can start meanwhile.
func TestFilterStuckSequenceHeals(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	d := newDB(1000)
	plain := &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}}
	first, err := guard.New(ctx, c, "product", plain)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := first.Rebuild(ctx, ids("p", 1000), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.FlushMasters(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Add(ctx, "p1000"); err != nil { // the stuck sequence
		t.Fatal(err)
	}
	g2, err := guard.New(ctx, redistest.Connect(t), "product", plain)
	if err != nil {
		t.Fatalf("a new process cannot start: %v", err)
	}
	defer g2.Close()
	withSource := *plain
	withSource.Filter.IDs = func(context.Context) iter.Seq2[string, error] { return ids("p", 1000) }
	g, err := guard.New(ctx, redistest.Connect(t), "product", &withSource) // rebuilds the filter it finds not ready
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := guard.Get(ctx, first, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { in, err := g.Info(ctx); return err == nil && in.Ready })
	before := d.calls.Load()
	for i := range 2000 {
		if _, err := guard.Get(ctx, g2, fmt.Sprintf("unknown%d", i), d.load); !errors.Is(err, guard.ErrNotFound) {
			t.Fatal(err)
		}
	}
	if n := d.calls.Load() - before; n > 60 { // 1% false positives: about 20
		t.Fatalf("%d of 2,000 unknown IDs reached the loader after the heal", n)
	}
}

// TestResizeDoesNotBreakStarts: after a Rebuild resized the filter, a
// process started with the old sizing adopts the stored layout (and says so
// once in its log).
func TestResizeDoesNotBreakStarts(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 100, nil) // ExpectedItems 10,000
	if _, err := g.Rebuild(ctx, ids("p", 100), &bloom.RebuildOptions{ExpectedItems: 50_000}); err != nil {
		t.Fatal(err)
	}
	var logs redistest.Logs
	old := &guard.Options{KeyPrefix: c.Prefix, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Filter: guard.FilterOptions{ExpectedItems: 10_000}}
	g2, err := guard.New(ctx, redistest.Connect(t), "product", old)
	if err != nil {
		t.Fatalf("a process with the old sizing cannot start: %v", err)
	}
	defer g2.Close()
	if n := strings.Count(logs.String(), "sized otherwise"); n != 1 {
		t.Fatalf("want one warning, got %d:\n%s", n, logs.String())
	}
	if in, err := g2.Info(ctx); err != nil || in.Config.ExpectedItems != 50_000 {
		t.Fatalf("adopted layout: %+v, %v", in.Config, err)
	}
	if p, err := guard.Get(ctx, g2, "p7", d.load); err != nil || p.Price != 7 {
		t.Fatalf("Get through the adopted layout: %+v, %v", p, err)
	}
	if _, err := guard.Get(ctx, g2, "unknown", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatal(err)
	}
	// With no sizing given, the stored one is taken without a warning
	// (the CLI opens Guards so).
	var logs3 redistest.Logs
	g3, err := guard.New(ctx, redistest.Connect(t), "product", &guard.Options{KeyPrefix: c.Prefix, Logger: slog.New(slog.NewTextHandler(&logs3, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g3.Close()
	if strings.Contains(logs3.String(), "sized otherwise") {
		t.Fatalf("a Guard given no sizing warned about it:\n%s", logs3.String())
	}
	if in, err := g3.Info(ctx); err != nil || in.Config.ExpectedItems != 50_000 {
		t.Fatalf("adopted layout: %+v, %v", in.Config, err)
	}
}

// TestFilterHealsAfterRestart: with the ID source named in Options and a
// go-redis client as new users build it, Redis SIGKILLed and
// restarted empty, three times: unknown IDs reach the loader while the
// filter is gone, and are rejected again once the Guard has rebuilt it by
// itself (the time it took is logged; docs/operations.md describes it).
func TestFilterHealsAfterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts Redis: make test")
	}
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, rdb := redistest.Private(t) // a client at go-redis's defaults but MaxRetries (off)
	d := newDB(100)
	g, err := guard.New(ctx, rdb, "product", &guard.Options{
		Logger: slog.New(slog.DiscardHandler),
		Filter: guard.FilterOptions{ExpectedItems: 10_000, IDs: func(context.Context) iter.Seq2[string, error] { return ids("p", 100) }},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	rejected := func(id string) bool {
		calls := d.calls.Load()
		_, err := guard.Get(ctx, g, id, d.load)
		return errors.Is(err, guard.ErrNotFound) && d.calls.Load() == calls
	}
	waitFor(t, func() bool { return rejected("before") }) // built by itself after New
	for round := range 3 {
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		i := 0
		eventually(t, 20*time.Second, fmt.Sprintf("round %d: unknown IDs rejected after Redis came back", round), func() bool {
			i++
			return rejected(fmt.Sprintf("unknown-%d-%d", round, i))
		})
		t.Logf("round %d: unknown IDs rejected again %v after Redis came back empty", round, time.Since(back).Round(time.Millisecond))
		if p, err := guard.Get(ctx, g, "p7", d.load); err != nil || p.Price != 7 {
			t.Fatalf("round %d: known ID after the heal: %+v, %v", round, p, err)
		}
	}
}
