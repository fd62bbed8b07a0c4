package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestStatsAlikeOnEveryEntryPoint runs one workload through Get, For,
// GetMany and the net/http middleware (its Peek, then the handler's Get):
// each ID asked twice, cold then warm, of rows that exist, one the
// database no longer has (a marker), a failing load, a panicking one and
// an unknown ID. Every entry point must count alike: one place counts.
func TestStatsAlikeOnEveryEntryPoint(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	rows := map[string]string{"a": "A", "b": "B"}
	errBoom := errors.New("db down")
	load := func(_ context.Context, id string) (string, error) {
		switch id {
		case "boom":
			return "", errBoom
		case "panic":
			panic("loader bug")
		}
		if v, ok := rows[id]; ok {
			return v, nil
		}
		return "", guard.ErrNotFound
	}
	many := func(ctx context.Context, ids []string) (map[string]string, error) {
		out := map[string]string{}
		for _, id := range ids {
			v, err := load(ctx, id)
			switch {
			case errors.Is(err, guard.ErrNotFound):
			case err != nil:
				return nil, err
			default:
				out[id] = v
			}
		}
		return out, nil
	}
	workload := []string{"a", "b", "gone", "boom", "panic", "zzz"}
	entry := map[string]func(g *guard.Guard, id string){
		"Get": func(g *guard.Guard, id string) { _, _ = guard.Get(ctx, g, id, load) },
		"For": func(g *guard.Guard, id string) {
			cache, err := guard.For(g, load)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = cache.Get(ctx, id)
		},
		"GetMany": func(g *guard.Guard, id string) { _, _ = guard.GetMany(ctx, g, []string{id}, many) },
		"middleware": func(g *guard.Guard, id string) {
			h := nethttp.Middleware(g, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, err := guard.Get(r.Context(), g, r.PathValue("id"), load); err != nil {
					nethttp.Error(w, r, err)
				}
			}))
			mux := http.NewServeMux()
			mux.Handle("GET /things/{id}", h)
			mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/things/"+id, nil))
		},
	}
	counted := func(s guard.Stats) guard.Stats { // the outcome and load counters
		return guard.Stats{Hits: s.Hits, LocalHits: s.LocalHits, EmptyHits: s.EmptyHits, BloomRejects: s.BloomRejects,
			Misses: s.Misses, Coalesced: s.Coalesced, Loads: s.Loads, LoadErrors: s.LoadErrors, RedisErrors: s.RedisErrors}
	}
	want := guard.Stats{Hits: 2, EmptyHits: 1, BloomRejects: 2, Misses: 3, Loads: 7, LoadErrors: 4}
	for name, call := range entry {
		t.Run(name, func(t *testing.T) {
			g, err := guard.New(ctx, c, "thing", &guard.Options{KeyPrefix: c.Prefix + "-" + name,
				Filter: guard.FilterOptions{ExpectedItems: 1000}})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if _, err := g.Rebuild(ctx, guard.IDs([]string{"a", "b", "gone", "boom", "panic"}), nil); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				for _, id := range workload {
					call(g, id)
				}
				if err := guard.Flush(ctx, g); err != nil {
					t.Fatal(err)
				}
			}
			if got := counted(g.Stats()); got != want {
				t.Fatalf("%s counted\n %+v\nwant\n %+v", name, got, want)
			}
		})
	}
}

// TestBatchCountsEachID: a GetMany batch of N IDs is N loads, and N load
// errors when it fails, as N Gets would be.
func TestBatchCountsEachID(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	g, err := guard.New(ctx, c, "thing", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, guard.IDs([]string{"x", "y", "z"}), nil); err != nil {
		t.Fatal(err)
	}
	_, err = guard.GetMany(ctx, g, []string{"x", "y", "z"}, func(context.Context, []string) (map[string]int, error) {
		return nil, errors.New("db down")
	})
	if err == nil {
		t.Fatal("a failed batch answered")
	}
	if st := g.Stats(); st.Loads != 3 || st.LoadErrors != 3 {
		t.Fatalf("a failed batch of 3: Loads %d, LoadErrors %d; want 3 and 3", st.Loads, st.LoadErrors)
	}
}
