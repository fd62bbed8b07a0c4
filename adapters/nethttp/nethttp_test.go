package nethttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

type user struct{ ID, Name string }

// app is a small service: /users/{id} behind the middleware, reading through
// guard.Get from a map "database" with a call counter.
type app struct {
	g     *guard.Guard
	loads atomic.Int64
	rows  map[string]user
}

func (a *app) handler() http.Handler {
	mux := http.NewServeMux()
	mw := nethttp.Middleware(a.g, nil)
	mux.Handle("GET /users/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := guard.Get(r.Context(), a.g, r.PathValue("id"), func(ctx context.Context, id string) (user, error) {
			a.loads.Add(1)
			u, ok := a.rows[id]
			if !ok {
				return user{}, guard.ErrNotFound
			}
			return u, nil
		})
		if err != nil {
			nethttp.Error(w, r, err)
			return
		}
		fmt.Fprintf(w, "user %s", u.Name)
	})))
	return mux
}

func newApp(t *testing.T, rdb redis.UniversalClient, prefix string) *app {
	return newAppWith(t, rdb, &guard.Options{KeyPrefix: prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
}

// newAppWith is newApp with the Guard's options.
func newAppWith(t *testing.T, rdb redis.UniversalClient, opts *guard.Options) *app {
	t.Helper()
	ctx := context.Background()
	g, err := guard.New(ctx, rdb, "user", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	a := &app{g: g, rows: map[string]user{"1": {"1", "Ada"}, "2": {"2", "Grace"}}}
	ids := func(yield func(string, error) bool) {
		for _, id := range []string{"1", "2", "3"} { // 3: in the filter, deleted from the DB
			if !yield(id, nil) {
				return
			}
		}
	}
	if _, err := g.Rebuild(ctx, ids, nil); err != nil {
		t.Fatal(err)
	}
	return a
}

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec
}

func TestUnknownKnownMalformed(t *testing.T) {
	c := redistest.Connect(t)
	a := newApp(t, c, c.Prefix)
	h := a.handler()

	if rec := get(t, h, "/users/1"); rec.Code != 200 || rec.Body.String() != "user Ada" {
		t.Fatalf("known: %d %q", rec.Code, rec.Body)
	}
	// A hit through the middleware: the handler's Get reuses its read.
	c.Counter.Reset()
	if rec := get(t, h, "/users/1"); rec.Code != 200 || c.Counter.RoundTrips() != 1 {
		t.Fatalf("hit: %d, %d round trips", rec.Code, c.Counter.RoundTrips())
	}
	c.Counter.Reset()
	if rec := get(t, h, "/users/999"); rec.Code != 404 || c.Counter.RoundTrips() != 1 {
		t.Fatalf("reject: %d, %d round trips", rec.Code, c.Counter.RoundTrips())
	}

	// A real not-found from the handler (ID 3 passes the filter, the DB has
	// no row) and a filter rejection must be indistinguishable.
	real := get(t, h, "/users/3")
	loads := a.loads.Load()
	rejected := get(t, h, "/users/999")
	if a.loads.Load() != loads {
		t.Fatal("the loader ran for an ID the filter rejects")
	}
	if real.Code != 404 || rejected.Code != 404 {
		t.Fatalf("codes %d %d", real.Code, rejected.Code)
	}
	if !bytes.Equal(real.Body.Bytes(), rejected.Body.Bytes()) || fmt.Sprint(real.Header()) != fmt.Sprint(rejected.Header()) {
		t.Fatalf("bodies differ:\n%s %v\n%s %v", real.Body, real.Header(), rejected.Body, rejected.Header())
	}
	if ct := rejected.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q", ct)
	}

	for _, bad := range []string{"..%2Fx", strings.Repeat("a", 4097), "%00", "%7Bx%7D", "42:lock"} {
		c.Counter.Reset()
		rec := get(t, h, "/users/"+bad)
		if rec.Code != 400 {
			t.Fatalf("%q: %d", bad, rec.Code)
		}
		if n := c.Counter.Commands(); n != 0 {
			t.Fatalf("%q: %d Redis commands", bad, n)
		}
		if strings.Contains(rec.Body.String(), "cacheguard") {
			t.Fatalf("internal text leaked: %s", rec.Body)
		}
	}
}

func TestRedisDownFailOpenAndClosed(t *testing.T) {
	srv, rdb := redistest.Private(t)
	a := newApp(t, rdb, "down")
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		io.WriteString(w, "from the handler")
	})
	open := http.NewServeMux()
	open.Handle("GET /users/{id}", nethttp.Middleware(a.g, nil)(handler))
	if rec := get(t, open, "/users/1"); rec.Code != 200 || rec.Body.String() != "from the handler" {
		t.Fatalf("fail open: %d %q", rec.Code, rec.Body)
	}
	closed := http.NewServeMux()
	closed.Handle("GET /users/{id}", nethttp.Middleware(a.g, &nethttp.Options{Rules: adapters.Rules{FailClosed: true}})(handler))
	rec := get(t, closed, "/users/1")
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" || ran.Load() != 1 {
		t.Fatalf("fail closed: %d %v, handler ran %d", rec.Code, rec.Header(), ran.Load())
	}
	// Fail open really serves: the handler's guard.Get loads through (the
	// outage policy) and answers from the source of truth.
	loads := a.loads.Load()
	if rec := get(t, a.handler(), "/users/1"); rec.Code != 200 || rec.Body.String() != "user Ada" || a.loads.Load() != loads+1 {
		t.Fatalf("handler with Redis down: %d %q", rec.Code, rec.Body)
	}
}

func TestErrorMapping(t *testing.T) {
	cases := map[error]int{
		guard.ErrNotFound:                                 404,
		fmt.Errorf("x: %w", guard.ErrInvalidKey):          400,
		guard.ErrBusy:                                     503,
		fmt.Errorf("%w: dial", guard.ErrUnavailable):      503,
		errors.New("secret database password in message"): 500,
	}
	for err, want := range cases {
		rec := httptest.NewRecorder()
		nethttp.Error(rec, httptest.NewRequest("GET", "/", nil), err)
		if rec.Code != want || strings.Contains(rec.Body.String(), "secret") {
			t.Fatalf("%v: %d %s", err, rec.Code, rec.Body)
		}
	}
}
