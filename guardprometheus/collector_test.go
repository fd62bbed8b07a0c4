package guardprometheus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/guardprometheus"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func rebuild(t *testing.T, g *guard.Guard, ids ...string) {
	t.Helper()
	if _, err := g.Rebuild(context.Background(), func(yield func(string, error) bool) {
		for _, id := range ids {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestKnownSequenceReadsBack: the values a registry gathers after a known
// sequence of Gets on two Guards.
func TestKnownSequenceReadsBack(t *testing.T) {
	c := redistest.Connect(t)
	ctx := context.Background()
	products := newGuard(t, c, "product")
	users := newGuard(t, c, "user")
	rebuild(t, products, "1", "2", "3")
	rebuild(t, users, "7")

	load := func(ctx context.Context, id string) (string, error) {
		switch id {
		case "1", "7":
			return "row " + id, nil
		case "2":
			return "", errors.New("db down")
		}
		return "", guard.ErrNotFound
	}
	for _, id := range []string{"1", "1", "1", "404", "405", "3", "3", "2"} {
		_, _ = guard.Get(ctx, products, id, load)
	}
	_, _ = guard.Get(ctx, users, "8", load)

	reg := prometheus.NewPedanticRegistry() // also checks descriptors against what is collected
	col := guardprometheus.New(nil, products, users)
	reg.MustRegister(col)
	want := `
# HELP cacheguard_gets_total Get calls (and GetMany IDs) answered, by outcome: hit, local_hit, marker, reject, miss.
# TYPE cacheguard_gets_total counter
cacheguard_gets_total{guard="product",outcome="hit"} 2
cacheguard_gets_total{guard="product",outcome="local_hit"} 0
cacheguard_gets_total{guard="product",outcome="marker"} 1
cacheguard_gets_total{guard="product",outcome="miss"} 2
cacheguard_gets_total{guard="product",outcome="reject"} 2
cacheguard_gets_total{guard="user",outcome="hit"} 0
cacheguard_gets_total{guard="user",outcome="local_hit"} 0
cacheguard_gets_total{guard="user",outcome="marker"} 0
cacheguard_gets_total{guard="user",outcome="miss"} 0
cacheguard_gets_total{guard="user",outcome="reject"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cacheguard_gets_total"); err != nil {
		t.Fatal(err)
	}
	events := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauges := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var g string
			for _, l := range m.GetLabel() {
				if l.GetName() == "guard" {
					g = l.GetValue()
				}
			}
			if g != "product" {
				continue
			}
			switch mf.GetName() {
			case "cacheguard_events_total":
				events[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			default:
				if m.GetGauge() != nil {
					gauges[mf.GetName()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	// Loads: "1", "3" (not found) and "2" (failed).
	if events["load"] != 3 || events["load_error"] != 1 || events["redis_error"] != 0 {
		t.Fatalf("events: %v", events)
	}
	info, err := products.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gauges["cacheguard_bloom_fill_ratio"] != info.FillRatio || info.FillRatio <= 0 ||
		gauges["cacheguard_bloom_estimated_fp_rate"] != info.EstimatedFPRate ||
		gauges["cacheguard_bloom_added_items"] != 3 || gauges["cacheguard_filter_ready"] != 1 || gauges["cacheguard_unwritten"] != 0 ||
		gauges["cacheguard_bloom_info_errors"] != 0 || gauges["cacheguard_bloom_memory_bytes"] <= 0 {
		t.Fatalf("gauges %v, info %+v", gauges, info)
	}
	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// TestRedisDownStillScrapes: with Redis gone the counters are served and
// the filter shows as unreadable; the scrape does not fail. An unknown ID
// answered from the filter's copy counts as an unconfirmed event.
func TestRedisDownStillScrapes(t *testing.T) {
	srv, rdb := redistest.Private(t)
	ctx := context.Background()
	g, err := guard.New(ctx, rdb, "product", &guard.Options{Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	rebuild(t, g, "1")
	if g.Stats().FilterCopy == 0 { // Rebuild refreshes it before it returns
		t.Fatal("no copy of the filter after its rebuild")
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	load := func(context.Context, string) (string, error) { return "", guard.ErrNotFound }
	if _, err := guard.Get(ctx, g, "nope", load); !errors.Is(err, guard.ErrUnconfirmed) {
		t.Fatalf("an unknown ID with Redis down: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(guardprometheus.New(&guardprometheus.Options{InfoTimeout: 200e6}, g))
	want := `
# HELP cacheguard_bloom_info_errors 1 when the filter could not be read during this scrape.
# TYPE cacheguard_bloom_info_errors gauge
cacheguard_bloom_info_errors{guard="product"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cacheguard_bloom_info_errors"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "cacheguard_gets_total"); err != nil || n != 5 {
		t.Fatalf("gets_total series with Redis down: %d %v", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var unconfirmed, copyBytes float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case mf.GetName() == "cacheguard_filter_copy_bytes":
				copyBytes = m.GetGauge().GetValue()
			case mf.GetName() == "cacheguard_events_total" && m.GetLabel()[0].GetValue() == "unconfirmed":
				unconfirmed = m.GetCounter().GetValue()
			}
		}
	}
	if unconfirmed != 1 || copyBytes <= 0 {
		t.Fatalf("unconfirmed events %v, filter_copy_bytes %v; want 1, > 0", unconfirmed, copyBytes)
	}
	// A write that cannot land: the unwritten gauge says so.
	if err := g.Invalidate(ctx, "1"); err == nil {
		t.Fatal("an Invalidate with Redis down returned nil")
	}
	want = `
# HELP cacheguard_unwritten IDs whose write did not reach Redis and waits for its replay (+1 while the set overflowed): alert when it stays above 0.
# TYPE cacheguard_unwritten gauge
cacheguard_unwritten{guard="product"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cacheguard_unwritten"); err != nil {
		t.Fatal(err)
	}
}

// TestFilterReadyFollowsTheGuard: a filter that is not ready (never built)
// shows as filter_ready 0 once a Get fails open, and 1 once rebuilt.
func TestFilterReadyFollowsTheGuard(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	g := newGuard(t, c, "product")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(guardprometheus.New(&guardprometheus.Options{SkipFilterInfo: true}, g))
	ready := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "cacheguard_filter_ready" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no cacheguard_filter_ready")
		return 0
	}
	load := func(context.Context, string) (string, error) { return "v", nil }
	if _, err := guard.Get(ctx, g, "1", load); err != nil {
		t.Fatal(err)
	}
	if r := ready(); r != 0 {
		t.Fatalf("filter_ready %v while the Guard fails open", r)
	}
	rebuild(t, g, "1")
	if _, err := guard.Get(ctx, g, "2", load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("after the rebuild: %v", err)
	}
	if r := ready(); r != 1 {
		t.Fatalf("filter_ready %v once rebuilt", r)
	}
}

// newGuard is a Guard named name on c, under the test's key prefix, closed
// when the test ends.
func newGuard(t *testing.T, c *redistest.Conn, name string) *guard.Guard {
	t.Helper()
	g, err := guard.New(context.Background(), c, name, &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}
