package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheguard/cacheguard/follow/postgres/followprometheus"
	"github.com/cacheguard/cacheguard/internal/doccheck"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestDocsMetrics: the cacheguard_pgfollow_* names README.md and docs/
// give are those -metrics serves, and each it serves is named there. A
// family that has no sample yet (consistency_nines, until an inconsistency
// is found) is not in a scrape: the names the collector describes count
// too, once the scrape shows -metrics serves that collector.
func TestDocsMetrics(t *testing.T) {
	ctx := context.Background()
	srv, _, c, _, _ := newProducts(t, "wal_level=logical")
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Server(t)
	args := []string{"-pg", srv.URL("postgres"), "-redis", followerURL(rs, c), "-prefix", c.Prefix,
		"-table", "products=product", "-create", "-metrics", fmt.Sprintf("127.0.0.1:%d", port)}
	cmdCtx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(cmdCtx, args, func(string) string { return "" }, &stderr) }()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("exit %d\n%s", code, stderr.String())
		}
	}()
	positioned(t, c)
	var body []byte
	waitFor(t, "-metrics to serve the follower's gauges", func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return bytes.Contains(body, []byte("cacheguard_pgfollow_lag_bytes"))
	})
	served := doccheck.Served(string(body))
	scraped := len(served)
	descs := make(chan *prometheus.Desc, 64)
	followprometheus.New(nil).Describe(descs) // Describe reads no Follower
	close(descs)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			served[m[1]] = true
		}
	}
	doccheck.TestMetrics(t, served, "cacheguard-pgfollow -metrics", "cacheguard_pgfollow_")
	t.Logf("%d of them in the scrape, the others described by the collector", scraped)
}
