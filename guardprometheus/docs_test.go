package guardprometheus_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/guardprometheus"
	"github.com/cacheguard/cacheguard/internal/doccheck"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestDocsMetrics: the cacheguard_* names README.md and docs/ give are
// those the collector serves over a Guard, and each it serves is named
// there (doccheck.MetricOwners: the follower's and the shop's are theirs).
func TestDocsMetrics(t *testing.T) {
	c := redistest.Connect(t)
	ctx := context.Background()
	g := newGuard(t, c, "product")
	rebuild(t, g, "1")
	_, _ = guard.Get(ctx, g, "1", func(context.Context, string) (string, error) { return "row", nil })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(guardprometheus.New(nil, g))
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	doccheck.TestMetrics(t, doccheck.Served(rec.Body.String()), "guardprometheus's collector", "cacheguard_")
}
