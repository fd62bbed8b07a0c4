package echov5_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	labecho "github.com/labstack/echo/v5"
	"github.com/redis/go-redis/v9"

	cgecho "github.com/cacheguard/cacheguard/adapters/echov5"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

type product struct{ ID, Name string }

type app struct {
	e     *labecho.Echo
	g     *guard.Guard
	loads atomic.Int64
	ran   atomic.Int64 // handler runs
}

func newApp(t *testing.T, rdb redis.UniversalClient, prefix string, cfg cgecho.Config) *app {
	return newAppWith(t, rdb, &guard.Options{KeyPrefix: prefix, ExpectedItems: 1000}, cfg)
}

// newAppWith is newApp with the Guard's options.
func newAppWith(t *testing.T, rdb redis.UniversalClient, opts *guard.Options, cfg cgecho.Config) *app {
	t.Helper()
	ctx := context.Background()
	g, err := guard.New(ctx, rdb, "product", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		_ = yield("1", nil) && yield("3", nil) // 3: in the filter, deleted from the DB
	}, nil); err != nil {
		t.Fatal(err)
	}
	a := &app{e: labecho.New(), g: g}
	a.e.HTTPErrorHandler = cgecho.ErrorHandler(labecho.DefaultHTTPErrorHandler(false))
	a.e.GET("/products/:id", func(c *labecho.Context) error {
		a.ran.Add(1)
		p, err := guard.Get(c.Request().Context(), g, c.Param("id"), func(ctx context.Context, id string) (product, error) {
			a.loads.Add(1)
			if id == "1" {
				return product{"1", "lamp"}, nil
			}
			return product{}, guard.ErrNotFound
		})
		if err != nil {
			return cgecho.HTTPError(err)
		}
		return c.String(http.StatusOK, p.Name)
	}, cgecho.MiddlewareWithConfig(g, cfg))
	return a
}

func get(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec
}

func TestUnknownKnownMalformed(t *testing.T) {
	c := redistest.Connect(t)
	a := newApp(t, c, c.Prefix, cgecho.DefaultConfig)
	if rec := get(a.e, "/products/1"); rec.Code != 200 || rec.Body.String() != "lamp" {
		t.Fatalf("known: %d %q", rec.Code, rec.Body)
	}
	c.Counter.Reset()
	if rec := get(a.e, "/products/1"); rec.Code != 200 || c.Counter.RoundTrips() != 1 {
		t.Fatalf("hit through the middleware: %d, %d round trips", rec.Code, c.Counter.RoundTrips())
	}
	real := get(a.e, "/products/3")
	loads := a.loads.Load()
	rejected := get(a.e, "/products/999")
	if a.loads.Load() != loads {
		t.Fatal("the loader ran for an ID the filter rejects")
	}
	if real.Code != 404 || rejected.Code != 404 || !bytes.Equal(real.Body.Bytes(), rejected.Body.Bytes()) ||
		fmt.Sprint(real.Header()) != fmt.Sprint(rejected.Header()) {
		t.Fatalf("not identical:\n%d %s %v\n%d %s %v", real.Code, real.Body, real.Header(), rejected.Code, rejected.Body, rejected.Header())
	}
	if ct := rejected.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q", ct)
	}
	for _, bad := range []string{"..%2Fx", strings.Repeat("a", 300), "%00", "%7Bx%7D", "42:lock"} {
		c.Counter.Reset()
		rec := get(a.e, "/products/"+bad)
		if rec.Code != 400 || c.Counter.Commands() != 0 {
			t.Fatalf("%q: %d, %d Redis commands", bad, rec.Code, c.Counter.Commands())
		}
	}
}

func TestSkipperAndRedisDown(t *testing.T) {
	srv, rdb := redistest.Private(t)

	open := newApp(t, rdb, "open", cgecho.DefaultConfig)
	closedCfg := cgecho.DefaultConfig
	closedCfg.FailClosed = true
	closed := newApp(t, rdb, "closed", closedCfg)
	skipCfg := cgecho.DefaultConfig
	skipCfg.Skipper = func(c *labecho.Context) bool { return c.Request().Header.Get("X-Internal") != "" }
	skip := newApp(t, rdb, "skip", skipCfg)

	req := httptest.NewRequest("GET", "/products/999", nil)
	req.Header.Set("X-Internal", "1")
	rec := httptest.NewRecorder()
	skip.e.ServeHTTP(rec, req)
	if rec.Code != 404 || skip.ran.Load() != 1 {
		t.Fatalf("skipped middleware: the handler must decide: %d, handler ran %d", rec.Code, skip.ran.Load())
	}

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	// Fail open: the middleware lets the request through, and the
	// handler's guard.Get loads through (the outage policy): served from
	// the source of truth.
	loads := open.loads.Load()
	rec = get(open.e, "/products/1")
	if rec.Code != 200 || rec.Body.String() != "lamp" || open.loads.Load() != loads+1 {
		t.Fatalf("fail open: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	loads = closed.loads.Load()
	rec = get(closed.e, "/products/1")
	if rec.Code != 503 || closed.loads.Load() != loads {
		t.Fatalf("fail closed: %d, loads %d", rec.Code, closed.loads.Load()-loads)
	}
}
