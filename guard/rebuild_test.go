package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// logWatch is a slog handler that lets a test wait for a message; each is
// kept as "LEVEL message attrs".
type logWatch struct {
	mu   sync.Mutex
	msgs []string
	seen chan struct{} // a message came in
}

func newLogWatch() *logWatch { return &logWatch{seen: make(chan struct{}, 1)} }

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logWatch) WithGroup(string) slog.Handler            { return w }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	m := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { m += " " + a.String(); return true })
	w.mu.Lock()
	w.msgs = append(w.msgs, m)
	w.mu.Unlock()
	select {
	case w.seen <- struct{}{}:
	default:
	}
	return nil
}

// wait waits until a message containing s has been logged.
func (w *logWatch) wait(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		w.mu.Lock()
		found := slices.ContainsFunc(w.msgs, func(m string) bool { return strings.Contains(m, s) })
		w.mu.Unlock()
		if found {
			return
		}
		select {
		case <-w.seen:
		case <-deadline:
			t.Fatalf("no log message with %q in 20 s", s)
		}
	}
}

// waitReady waits until g's filter is ready at a generation after gen.
func waitReady(t *testing.T, g *guard.Guard, after int64) bloom.Info {
	t.Helper()
	var in bloom.Info
	eventually(t, 20*time.Second, fmt.Sprintf("filter rebuilt past generation %d", after), func() bool {
		var err error
		in, err = g.Info(context.Background())
		return err == nil && in.Ready && in.Generation > after
	})
	return in
}

// TestIDSourceReadAfterAnnounce replays the race step by step: the
// automatic rebuild calls Filter.IDs, which (like README's productIDs)
// reads its rows when called; a row is created and its Add returns right
// after that read. The new generation must hold it. The control replays
// the order the Guard used before (source read, Add, then the rebuild
// announced): the row answers "not found", so the assertion can fail.
func TestIDSourceReadAfterAnnounce(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	d := newDB(10)
	opened := make(chan *guard.Guard, 1)
	var g *guard.Guard
	source := func(ctx context.Context) iter.Seq2[string, error] {
		snapshot := guard.IDs(slices.Collect(func(yield func(string) bool) { // the query, run now
			for id := range ids("p", 10) {
				if !yield(id) {
					return
				}
			}
		}))
		g := <-opened
		d.set(product{ID: "p10", Name: "created after the query"})
		if err := g.Add(ctx, "p10"); err != nil {
			t.Error(err)
		}
		return snapshot
	}
	g, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix,
		Filter: guard.FilterOptions{ExpectedItems: 1000, IDs: source}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	opened <- g
	waitReady(t, g, 0)
	if p, err := guard.Get(ctx, g, "p10", d.load); err != nil || p.ID != "p10" {
		t.Fatalf("a row created after the source's query: %+v, %v", p, err)
	}

	// Control: the source read before the generation is announced.
	f, err := bloom.Open(ctx, c, c.Prefix+":control", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Rebuild(ctx, ids("p", 10), nil); err != nil {
		t.Fatal(err)
	}
	snapshot := slices.Collect(func(yield func(string) bool) {
		for id := range ids("p", 10) {
			yield(id)
		}
	})
	if err := f.Add(ctx, "p10"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Rebuild(ctx, guard.IDs(snapshot), nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.Test(ctx, "p10"); err != nil || ok {
		t.Fatalf("control: the old order kept p10 (%v, %v): this test could not fail", ok, err)
	}
}

// TestShortSourceKeepsTheFilter: an ID source that comes back empty or cut
// short (a failed query) must not make existing rows answer "not found",
// through Rebuild (ErrShortSource) or the automatic rebuild (refused with
// an ERROR; Gets fail open meanwhile); with Force a rebuild goes through.
func TestShortSourceKeepsTheFilter(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	c := redistest.Connect(t)
	d := newDB(100)
	var mu sync.Mutex
	n := 100
	source := func(context.Context) iter.Seq2[string, error] {
		mu.Lock()
		defer mu.Unlock()
		return ids("p", n)
	}
	logs := newLogWatch()
	g, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix, Logger: slog.New(logs),
		Filter: guard.FilterOptions{ExpectedItems: 1000, IDs: source}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	in := waitReady(t, g, 0)
	for _, short := range []int{0, 40} {
		if _, err := g.Rebuild(ctx, ids("p", short), nil); !errors.Is(err, bloom.ErrShortSource) {
			t.Fatalf("Rebuild from %d of 100 IDs: %v; want ErrShortSource", short, err)
		}
	}
	// The filter lost (its shard evicted), and the source broken: the
	// automatic rebuild is refused, and every row still loads.
	mu.Lock()
	n = 0
	mu.Unlock()
	if err := c.Del(ctx, keyspace.ForFilter(c.Prefix+":product:bf").Shard(in.Generation, 0)).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		id := fmt.Sprintf("p%d", i)
		if p, err := guard.Get(ctx, g, id, d.load); err != nil || p.ID != id {
			t.Fatalf("Get(%s) with the filter lost and the source empty: %+v, %v", id, p, err)
		}
	}
	logs.wait(t, "automatic bloom rebuild refused")
	mu.Lock()
	n = 100
	mu.Unlock()
	waitReady(t, g, in.Generation) // the source mended: the next attempt lands
	if _, err := g.Rebuild(ctx, ids("p", 10), &bloom.RebuildOptions{Force: true}); err != nil {
		t.Fatalf("Force: %v", err)
	}
}

// TestAutoRebuildAfterRebuild replays a start-up race step by step: New
// starts the automatic rebuild (the filter was never built), which is held
// after its checks, before the rebuild lock (a hook on the client holds the
// answer of its last check, auto_rebuild.lua), while the application's own
// Rebuild runs and makes the filter ready. Released, it must not rebuild
// again: a second rebuild read every ID once more, and reads failed open
// while it switched generations (the fault suite's TestTLS saw MayExist
// say true for an unknown ID). The control holds it the same way with no
// Rebuild meanwhile: it must range Filter.IDs, so the count can fail.
func TestAutoRebuildAfterRebuild(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	h := hooked(c)
	for _, tc := range []struct {
		name    string
		rebuild bool // the application's Rebuild runs while the automatic one is held
	}{{"after Rebuild", true}, {"control", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var ranged atomic.Int32
			source := func(context.Context) iter.Seq2[string, error] {
				ranged.Add(1)
				return ids("p", 10)
			}
			name := strings.ReplaceAll(tc.name, " ", "-")
			auto := keyspace.ForFilter(c.Prefix + ":" + name + ":bf").AutoRebuilt()
			reached, release := make(chan struct{}), make(chan struct{})
			var held atomic.Bool
			hold := func(cmd redis.Cmder) {
				if a := cmd.Args(); len(a) < 4 || a[3] != auto {
					return
				}
				r, ok := cmd.(*redis.Cmd)
				if !ok {
					return
				}
				may, err := r.Int64()                                           // auto_rebuild.lua's answer: not 0, the rebuild may start
				if err == nil && may != 0 && held.CompareAndSwap(false, true) { // the first one only
					close(reached)
					<-release
				}
			}
			h.answered.Store(&hold)
			defer h.answered.Store(nil)
			g, err := guard.New(ctx, c, name, &guard.Options{KeyPrefix: c.Prefix,
				Filter: guard.FilterOptions{ExpectedItems: 1000, IDs: source}})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			select {
			case <-reached:
			case <-time.After(20 * time.Second):
				t.Fatal("the automatic rebuild never started")
			}
			var gen int64
			if tc.rebuild {
				if _, err := g.Rebuild(ctx, ids("p", 10), nil); err != nil {
					t.Fatal(err)
				}
				in, err := g.Info(ctx)
				if err != nil || !in.Ready {
					t.Fatalf("after Rebuild: %+v, %v", in, err)
				}
				gen = in.Generation
			}
			close(release)
			eventually(t, 20*time.Second, "the automatic rebuild ended", func() bool { return !guard.AutoRebuilding(g) })
			in, err := g.Info(ctx)
			switch {
			case err != nil || !in.Ready:
				t.Fatalf("filter after the automatic rebuild: %+v, %v", in, err)
			case tc.rebuild && (ranged.Load() != 0 || in.Generation != gen):
				t.Fatalf("the automatic rebuild ran again after Rebuild: Filter.IDs ranged %d times, generation %d (Rebuild's: %d)",
					ranged.Load(), in.Generation, gen)
			case !tc.rebuild && ranged.Load() != 1:
				t.Fatalf("control: Filter.IDs ranged %d times, want 1: this test could not fail", ranged.Load())
			}
		})
	}
}
