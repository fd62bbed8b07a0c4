package nethttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// Another router (chi, gorilla/mux) routes through Options.ID: the
// middleware reads the ID as the handler does. With chi:
//
//	id := func(r *http.Request) string { return chi.URLParam(r, "id") }
//	r.With(nethttp.Middleware(g, &nethttp.Options{ID: id})).Get("/users/{id}", getUser)
//
// (runnable in examples/chi, a module of its own). Here a ServeMux subtree
// stands in for a router (the root module requires none), with the ID
// taken from the path.
func ExampleOptions_iD() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: the client README.md sets up
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-router-user", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)

	id := func(r *http.Request) string { return strings.TrimPrefix(r.URL.Path, "/users/") }
	mw := nethttp.Middleware(g, &nethttp.Options{ID: id})
	mux := http.NewServeMux()
	mux.Handle("GET /users/", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := guard.Get(r.Context(), g, id(r), func(ctx context.Context, id string) (string, error) {
			return "Ada", nil // SELECT name FROM users WHERE id = $1
		})
		if err != nil {
			nethttp.Error(w, r, err)
			return
		}
		fmt.Fprint(w, name)
	})))

	for _, path := range []string{"/users/42", "/users/7"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(rec.Code, rec.Body.String())
	}
	// Output:
	// 200 Ada
	// 404 {"type":"about:blank","title":"Not Found","status":404}
}
