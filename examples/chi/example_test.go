// Package chiexample shows the net/http adapter behind chi: its own module,
// so that the root module requires no router.
package chiexample

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// chi routes, and the middleware reads the ID through Options.ID with
// chi.URLParam (chi v5.5 fills r.PathValue too, the default ID). It goes
// on the route (With, or Use inside a Group), where chi has matched the
// path: a Use on the top router runs before the routing and finds no ID.
func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: the client README.md sets up
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-chi-product", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)

	id := func(r *http.Request) string { return chi.URLParam(r, "id") }
	r := chi.NewRouter()
	r.With(nethttp.Middleware(g, &nethttp.Options{ID: id})).Get("/products/{id}", func(w http.ResponseWriter, r *http.Request) {
		name, err := guard.Get(r.Context(), g, id(r), func(ctx context.Context, id string) (string, error) {
			return "Desk lamp", nil // SELECT name FROM products WHERE id = $1
		})
		if err != nil {
			nethttp.Error(w, r, err) // 404, 400, 503 or 500 as problem+json
			return
		}
		fmt.Fprint(w, name)
	})

	for _, path := range []string{"/products/42", "/products/7", "/products/%7Bx%7D"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(rec.Code, rec.Body.String())
	}
	// Output:
	// 200 Desk lamp
	// 404 {"type":"about:blank","title":"Not Found","status":404}
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"malformed id"}
}
