package echov5_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	labecho "github.com/labstack/echo/v5"

	cgecho "github.com/cacheguard/cacheguard/adapters/echov5"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestRetryAfterIsTheConfiguredValue: ErrorHandler sends the middleware's
// RetryAfter with every 503, the middleware's own (fail closed) and the
// handler's HTTPError(err) (fail open), and logs the error behind it.
func TestRetryAfterIsTheConfiguredValue(t *testing.T) {
	srv, rdb := redistest.Private(t)
	var logs bytes.Buffer
	cfg := cgecho.DefaultConfig
	cfg.RetryAfter = 5 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	// The Guards fail fast, so that the handler's guard.Get reports the
	// outage (by default it would load through and answer 200).
	failFast := func(prefix string) *guard.Options {
		return &guard.Options{KeyPrefix: prefix, ExpectedItems: 1000, Outage: &guard.OutageOptions{FailFast: true}}
	}
	open := newAppWith(t, rdb, failFast("open"), cfg)
	cfg.FailClosed = true
	closed := newAppWith(t, rdb, failFast("closed"), cfg)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]*app{"fail open": open, "fail closed": closed} {
		rec := get(a.e, "/products/1")
		if rec.Code != 503 || rec.Header().Get("Retry-After") != "5" {
			t.Errorf("%s: %d, Retry-After %q, want 503 and 5", name, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
	if !strings.Contains(logs.String(), "redis unavailable") {
		t.Fatalf("the error behind the 503 was not logged:\n%s", logs.String())
	}
}

// TestUnfilteredRouteIsReported: a route whose parameter is not the
// middleware's Param passes unfiltered; logged once per route, counted per
// request; a route without parameters is quiet.
func TestUnfilteredRouteIsReported(t *testing.T) {
	c := redistest.Connect(t)
	a := newApp(t, c, c.Prefix, cgecho.DefaultConfig)
	var logs bytes.Buffer
	var unfiltered atomic.Int32
	cfg := cgecho.DefaultConfig
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.OnUnfiltered = func(string) { unfiltered.Add(1) }
	mw := cgecho.MiddlewareWithConfig(a.g, cfg)
	ok := func(c *labecho.Context) error { return c.NoContent(http.StatusOK) }
	a.e.GET("/items/:sku", ok, mw)
	a.e.GET("/items", ok, mw)
	for range 3 {
		if rec := get(a.e, "/items/999"); rec.Code != 200 {
			t.Fatalf("unfiltered route: %d", rec.Code)
		}
		get(a.e, "/items")
	}
	if n := unfiltered.Load(); n != 3 {
		t.Fatalf("OnUnfiltered called %d times, want 3", n)
	}
	if n := strings.Count(logs.String(), "unfiltered"); n != 1 || !strings.Contains(logs.String(), "/items/:sku") {
		t.Fatalf("want one warning naming the route, got %d:\n%s", n, logs.String())
	}
}
