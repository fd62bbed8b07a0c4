package nethttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func ExampleMiddleware() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-user", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)

	mux := http.NewServeMux()
	getUser := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := guard.Get(r.Context(), g, r.PathValue("id"), func(ctx context.Context, id string) (string, error) {
			return "Ada", nil // SELECT name FROM users WHERE id = $1
		})
		if err != nil {
			nethttp.Error(w, r, err) // 404, 400, 503 or 500 as problem+json
			return
		}
		fmt.Fprintln(w, name)
	})
	mux.Handle("GET /users/{id}", nethttp.Middleware(g, nil)(getUser))

	for _, path := range []string{"/users/42", "/users/7", "/users/%7Bx%7D"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Print(rec.Code, " ", rec.Body.String())
		fmt.Println()
	}
	// Output:
	// 200 Ada
	//
	// 404 {"type":"about:blank","title":"Not Found","status":404}
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"malformed id"}
}
