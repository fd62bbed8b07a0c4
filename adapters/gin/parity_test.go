package gin_test

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cacheguard/cacheguard/adapters/internal/adaptertest"
	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
)

// TestExampleRouterAnswersAsNetHTTP: the example's router (newRouter, the
// one ExampleMiddleware serves) answers as the net/http adapter on a
// ServeMux: an encoded slash is the middleware's 400 (not Gin's text 404),
// a trailing slash the router's own 404 (not a 301), a HEAD of an unknown
// ID the middleware's 404 and a POST a 405 with Allow. The problem answers
// are the same bytes and headers; the router's own text answers differ in
// wording only.
func TestExampleRouterAnswersAsNetHTTP(t *testing.T) {
	g := adaptertest.Guard(t, "42")
	mux := http.NewServeMux()
	mux.Handle("GET /products/{id}", nethttp.Middleware(g, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := guard.Get(r.Context(), g, r.PathValue("id"), func(ctx context.Context, id string) (string, error) {
			return "Desk lamp", nil
		})
		if err != nil {
			nethttp.Error(w, r, err)
			return
		}
		fmt.Fprint(w, name)
	})))
	engine := newRouter(g)
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/products/42", 200},
		{"HEAD", "/products/42", 200},
		{"GET", "/products/%34%32", 200}, // "42", decoded as r.PathValue decodes it
		{"GET", "/products/7", 404},
		{"HEAD", "/products/7", 404},
		{"GET", "/products/a%2Fb", 400},
		{"GET", "/products/..%2Fx", 400},
		{"GET", "/products/1/", 404}, // the router's own: no route, no redirect
		{"POST", "/products/42", 405},
	} {
		want, got := httptest.NewRecorder(), httptest.NewRecorder()
		mux.ServeHTTP(want, httptest.NewRequest(tc.method, tc.path, nil))
		engine.ServeHTTP(got, httptest.NewRequest(tc.method, tc.path, nil))
		req := tc.method + " " + tc.path
		if want.Code != tc.status || got.Code != tc.status {
			t.Errorf("%s: Gin %d (Location %q), net/http %d; want %d from both", req, got.Code, got.Header().Get("Location"), want.Code, tc.status)
			continue
		}
		if mt, wmt := mediaType(got), mediaType(want); mt != wmt {
			t.Errorf("%s: Gin's Content-Type %q, net/http's %q", req, got.Header().Get("Content-Type"), want.Header().Get("Content-Type"))
		}
		for _, h := range []string{"Allow", "Location"} {
			if got.Header().Get(h) != want.Header().Get(h) {
				t.Errorf("%s: Gin's %s %q, net/http's %q", req, h, got.Header().Get(h), want.Header().Get(h))
			}
		}
		if mediaType(want) != "application/problem+json" && tc.status != 200 {
			continue // the routers' own text: "404 page not found" and Gin's without the newline
		}
		for _, h := range []string{"Content-Type", "Content-Length", "X-Content-Type-Options"} {
			if got.Header().Get(h) != want.Header().Get(h) {
				t.Errorf("%s: Gin's %s %q, net/http's %q", req, h, got.Header().Get(h), want.Header().Get(h))
			}
		}
		if got.Body.String() != want.Body.String() {
			t.Errorf("%s: Gin's body %q, net/http's %q", req, got.Body, want.Body)
		}
	}
}

func mediaType(rec *httptest.ResponseRecorder) string {
	mt, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type"))
	return mt
}
