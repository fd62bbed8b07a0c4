// Package followprometheus exposes a PostgreSQL follower (package pgfollow)
// to Prometheus: a prometheus.Collector (client_golang) registered on the
// application's own registry, as cacheguard-pgfollow -metrics serves it.
// On each scrape it reads the follower's Stats once: the lag (bytes of WAL,
// seconds), whether it follows or stands by, the changes applied, the
// batches retried and the rollbacks of a Guard's Redis repaired, and the
// inspector's counts by table and delay (IDs read back, found inconsistent,
// repaired) with the consistency they show, as nines.
package followprometheus

import (
	"github.com/prometheus/client_golang/prometheus"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
)

// collector collects one follower's metrics. It holds no state of its own
// between scrapes: the follower keeps the counts.
type collector struct {
	f *pgfollow.Follower

	lagBytes, lagSeconds, following, standby *prometheus.Desc
	changes, retries, rollbacks              *prometheus.Desc
	inspected, inconsistent, repaired, nines *prometheus.Desc
}

// New returns a Collector of f's metrics. Register it with
// registry.MustRegister(followprometheus.New(f)).
func New(f *pgfollow.Follower) prometheus.Collector {
	name := func(n string) string { return prometheus.BuildFQName("cacheguard", "pgfollow", n) }
	td := []string{"table", "delay"}
	return &collector{
		f:          f,
		lagBytes:   prometheus.NewDesc(name("lag_bytes"), "Bytes of WAL between the server's position and the last applied change.", nil, nil),
		lagSeconds: prometheus.NewDesc(name("lag_seconds"), "Age of the oldest committed transaction not yet applied.", nil, nil),
		following:  prometheus.NewDesc(name("following"), "1 while the follower consumes the slot.", nil, nil),
		standby:    prometheus.NewDesc(name("standby"), "1 while another follower consumes the slot.", nil, nil),
		changes:    prometheus.NewDesc(name("changes_total"), "Row changes applied.", nil, nil),
		retries:    prometheus.NewDesc(name("retries_total"), "Batches tried again after Redis failed.", nil, nil),
		rollbacks: prometheus.NewDesc(name("rollbacks_total"),
			"Times a Guard's Redis was found behind the slot (its writes repaired).", nil, nil),
		inspected: prometheus.NewDesc(name("inspected_total"),
			"IDs written that the inspector read back, by table and delay after the write.", td, nil),
		inconsistent: prometheus.NewDesc(name("inconsistent_total"),
			"Inspected IDs found inconsistent: an entry or marker older than the write, or an inserted ID the filter lacks.",
			td, nil),
		repaired: prometheus.NewDesc(name("inspect_repaired_total"),
			"Inconsistencies the inspector repaired (Inspect.Repair).", td, nil),
		nines: prometheus.NewDesc(name("consistency_nines"),
			"Consistency the inspector found, as nines: -log10(inconsistent/inspected); absent until it finds an inconsistency.",
			td, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lagBytes, c.lagSeconds, c.following, c.standby, c.changes, c.retries, c.rollbacks,
		c.inspected, c.inconsistent, c.repaired, c.nines} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.f.Stats()
	ch <- prometheus.MustNewConstMetric(c.lagBytes, prometheus.GaugeValue, float64(st.LagBytes))
	ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, st.LagSeconds)
	ch <- prometheus.MustNewConstMetric(c.following, prometheus.GaugeValue, b2f(st.Following))
	ch <- prometheus.MustNewConstMetric(c.standby, prometheus.GaugeValue, b2f(st.Standby))
	ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(st.Changes))
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(st.Retries))
	ch <- prometheus.MustNewConstMetric(c.rollbacks, prometheus.CounterValue, float64(st.Rollbacks))
	for _, in := range st.Inspections {
		table, delay := in.Table, in.Delay.String()
		ch <- prometheus.MustNewConstMetric(c.inspected, prometheus.CounterValue, float64(in.Checked), table, delay)
		ch <- prometheus.MustNewConstMetric(c.inconsistent, prometheus.CounterValue, float64(in.Inconsistent), table, delay)
		ch <- prometheus.MustNewConstMetric(c.repaired, prometheus.CounterValue, float64(in.Repaired), table, delay)
		if in.Inconsistent > 0 { // none found: no figure (the checks show only a bound)
			ch <- prometheus.MustNewConstMetric(c.nines, prometheus.GaugeValue, in.Nines(), table, delay)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
