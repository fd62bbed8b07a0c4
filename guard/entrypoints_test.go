package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// entryPoints read one ID through each way a user reads: Get, For's
// handle, GetMany and the net/http middleware (Peek, then the handler's
// Get). A 404 from the middleware is ErrNotFound, a 503 ErrUnavailable.
var entryPoints = map[string]func(ctx context.Context, g *guard.Guard, d *db, id string) (product, error){
	"Get": func(ctx context.Context, g *guard.Guard, d *db, id string) (product, error) {
		return guard.Get(ctx, g, id, d.load)
	},
	"For": func(ctx context.Context, g *guard.Guard, d *db, id string) (product, error) {
		c, err := guard.For(g, d.load)
		if err != nil {
			return product{}, err
		}
		return c.Get(ctx, id)
	},
	"GetMany": func(ctx context.Context, g *guard.Guard, d *db, id string) (product, error) {
		m, err := guard.GetMany(ctx, g, []string{id}, (&batchDB{db: d}).loadMany)
		if err != nil {
			return product{}, err
		}
		p, ok := m[id]
		if !ok {
			return product{}, guard.ErrNotFound
		}
		return p, nil
	},
	"middleware": func(ctx context.Context, g *guard.Guard, d *db, id string) (product, error) {
		h := nethttp.Middleware(g, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, err := guard.Get(r.Context(), g, r.PathValue("id"), d.load)
			if err != nil {
				nethttp.Error(w, r, err)
				return
			}
			_ = json.NewEncoder(w).Encode(p)
		}))
		mux := http.NewServeMux()
		mux.Handle("GET /products/{id}", h)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/products/"+id, nil).WithContext(ctx))
		switch rec.Code {
		case http.StatusOK:
			var p product
			err := json.Unmarshal(rec.Body.Bytes(), &p)
			return p, err
		case http.StatusNotFound:
			return product{}, guard.ErrNotFound
		case http.StatusServiceUnavailable:
			return product{}, guard.ErrUnavailable
		}
		return product{}, errors.New(rec.Body.String())
	},
}

// TestGuaranteesOnEveryEntryPoint holds README's guarantees on each entry
// point (docs/guarantees.md): "writes", no stale read after Set, Delete or
// Add returns; "unbuilt", no false "not found" from a filter never built;
// "down", Redis failures never read as "not found", and a write that
// failed in an outage is never undone by the entry Redis kept.
func TestGuaranteesOnEveryEntryPoint(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	for name, read := range entryPoints {
		t.Run(name, func(t *testing.T) {
			t.Run("writes", func(t *testing.T) {
				_, g, d := setup(t, 10, nil)
				if p, err := read(ctx, g, d, "p1"); err != nil || p.Price != 1 {
					t.Fatalf("p1: %+v, %v", p, err)
				}
				updated := product{ID: "p1", Name: "updated", Price: 101}
				d.set(updated)
				if err := guard.Set(ctx, g, "p1", updated); err != nil {
					t.Fatal(err)
				}
				if p, err := read(ctx, g, d, "p1"); err != nil || p != updated {
					t.Fatalf("after Set: %+v, %v", p, err)
				}
				if _, err := read(ctx, g, d, "p99"); !errors.Is(err, guard.ErrNotFound) { // rejected, or a marker
					t.Fatalf("p99 before its creation: %v", err)
				}
				created := product{ID: "p99", Name: "new", Price: 99}
				d.set(created)
				if err := g.Add(ctx, "p99"); err != nil {
					t.Fatal(err)
				}
				if p, err := read(ctx, g, d, "p99"); err != nil || p != created {
					t.Fatalf("after Add: %+v, %v", p, err)
				}
				d.del("p2")
				if err := g.Delete(ctx, "p2"); err != nil {
					t.Fatal(err)
				}
				if _, err := read(ctx, g, d, "p2"); !errors.Is(err, guard.ErrNotFound) {
					t.Fatalf("after Delete: %v", err)
				}
			})
			t.Run("unbuilt", func(t *testing.T) {
				c := redistest.Connect(t)
				g, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				d := newDB(10)
				for i := range 10 {
					if p, err := read(ctx, g, d, pid(i)); err != nil || p.Price != i {
						t.Fatalf("%s with the filter not ready: %+v, %v", pid(i), p, err)
					}
				}
			})
			t.Run("down", func(t *testing.T) {
				if redistest.ClusterMode() {
					t.Skip("kills a private standalone server; the standalone run covers it")
				}
				srv, rdb := redistest.Private(t)
				g := openRebuilt(t, rdb, guard.Options{}, 1000, 10)
				d := newDB(10)
				if _, err := read(ctx, g, d, "p3"); err != nil {
					t.Fatal(err)
				}
				if err := rdb.Save(ctx).Err(); err != nil { // the dump keeps the old entry
					t.Fatal(err)
				}
				if err := srv.Kill(); err != nil {
					t.Fatal(err)
				}
				updated := product{ID: "p3", Name: "updated", Price: 303}
				d.set(updated)
				if err := guard.Set(ctx, g, "p3", updated); !errors.Is(err, guard.ErrUnavailable) {
					t.Fatalf("Set with Redis down: %v", err)
				}
				for _, id := range []string{"p3", "p4"} {
					if p, err := read(ctx, g, d, id); errors.Is(err, guard.ErrNotFound) || (err == nil && id == "p3" && p != updated) {
						t.Fatalf("%s with Redis down: %+v, %v", id, p, err)
					}
				}
				if err := srv.Restart(ctx); err != nil { // the old entry is back
					t.Fatal(err)
				}
				for range 20 {
					if p, err := read(ctx, g, d, "p3"); err == nil && p != updated {
						t.Fatalf("after the restart the old entry answered: %+v", p)
					}
				}
			})
		})
	}
}
