package main

import (
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheguard/cacheguard/follow/postgres/followprometheus"
	"github.com/cacheguard/cacheguard/internal/doccheck"
)

// docsNameTheMetrics: the cacheguard_pgfollow_* names README.md and docs/
// give are those -metrics serves (body, a scrape of it), and each it serves
// is named there. A family that has no sample yet (consistency_nines, until
// an inconsistency is found) is not in a scrape: the names the collector
// describes count too. TestCommand calls it with its scrape.
func docsNameTheMetrics(t *testing.T, body string) {
	t.Helper()
	served := doccheck.Served(body)
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
