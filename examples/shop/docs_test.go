package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/doccheck"
)

// TestDocsMetrics: the otel_cacheguard_* and shop_* names README.md and
// docs/ give are those the shop's /metrics serves, and each it serves is
// named there (its cacheguard_* ones are guardprometheus's to check).
func TestDocsMetrics(t *testing.T) {
	shop, hs := newTestShop(t, 10, 10)
	if code, body := do(t, "GET", hs.URL+"/products/1", ""); code != 200 { // a load
		t.Fatalf("GET /products/1: %d %s", code, body)
	}
	lockWait(t, shop)
	code, body := do(t, "GET", hs.URL+"/metrics", "")
	if code != 200 {
		t.Fatalf("GET /metrics: %d", code)
	}
	doccheck.TestMetrics(t, doccheck.Served(body), "the shop's /metrics", "otel_cacheguard_", "shop_")
}

// lockWait makes a Get on the shop's meter wait for another Guard's load
// of the same ID, as a Get in a second process would, so that the lock
// wait histogram has a point.
func lockWait(t *testing.T, shop *Shop) {
	t.Helper()
	ctx := context.Background()
	var gs [2]*guard.Guard
	for i := range gs {
		g, err := guard.New(ctx, shop.guardRDB, "docs", &guard.Options{Logger: slog.New(slog.DiscardHandler),
			Telemetry: guard.TelemetryOptions{MeterProvider: shop.tel.meter}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		gs[i] = g
	}
	if _, err := gs[0].Rebuild(ctx, guard.IDs([]string{"x"}), nil); err != nil {
		t.Fatal(err)
	}
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := guard.Get(ctx, gs[0], "x", func(context.Context, string) (string, error) {
			close(started)
			<-release
			return "v", nil
		})
		done <- err
	}()
	<-started
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	if _, err := guard.Get(ctx, gs[1], "x", func(context.Context, string) (string, error) { return "v", nil }); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
