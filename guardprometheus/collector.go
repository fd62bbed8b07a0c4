// Package guardprometheus exposes cacheguard Guards to Prometheus: a
// prometheus.Collector (client_golang) for one or more Guards, registered
// on the application's own registry. It lives in a module of its own, so
// the core needs no Prometheus.
//
// On each scrape the Collector reads every Guard's counters (Guard.Stats:
// Gets by outcome, loads, lock waits, Redis errors, writes lost...) and the
// gauges to alert on (filter_ready, unwritten), and, unless
// Options.SkipFilterInfo is set, its bloom filter's state (Guard.Info:
// fill ratio, estimated false-positive rate, items, memory), which counts
// the filter's bits in Redis (BITCOUNT), bounded by Options.InfoTimeout.
// Latency histograms (loads, lock waits) come from the Guard's
// OpenTelemetry metrics (guard.Options.Telemetry.MeterProvider), which the
// OpenTelemetry Prometheus exporter serves on the same registry.
package guardprometheus

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheguard/cacheguard/guard"
)

// Options configures a Collector. The zero value is ready to use.
type Options struct {
	// Namespace prefixes every metric name. Default "cacheguard".
	Namespace string
	// SkipFilterInfo leaves out the filter gauges (no Redis command per
	// scrape).
	SkipFilterInfo bool
	// InfoTimeout bounds the filter read of one Guard per scrape. Default
	// 2 seconds.
	InfoTimeout time.Duration
}

// Collector collects the metrics of its Guards. It holds no state of its
// own between scrapes: the Guards keep the counts.
type Collector struct {
	guards []*guard.Guard
	opts   Options

	gets, coalesced, events     *prometheus.Desc
	ready, unwritten, copyBytes *prometheus.Desc
	fill, fpRate, items, memory *prometheus.Desc
	scrapeErrors                *prometheus.Desc
}

// New returns a Collector for guards. Register it with
// registry.MustRegister(guardprometheus.New(nil, products, users)).
func New(opts *Options, guards ...*guard.Guard) *Collector {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Namespace == "" {
		o.Namespace = "cacheguard"
	}
	if o.InfoTimeout <= 0 {
		o.InfoTimeout = 2 * time.Second
	}
	name := func(n string) string { return prometheus.BuildFQName(o.Namespace, "", n) }
	g := []string{"guard"}
	return &Collector{
		guards: guards,
		opts:   o,
		gets: prometheus.NewDesc(name("gets_total"),
			"Get calls (and GetMany IDs) answered, by outcome: hit, local_hit, marker, reject, miss.", []string{"guard", "outcome"}, nil),
		coalesced: prometheus.NewDesc(name("coalesced_total"),
			"Gets answered by another caller's flight in this process (also counted by their outcome).", g, nil),
		events: prometheus.NewDesc(name("events_total"),
			"Guard operations and events: load, load_error, load_through, shed, abandoned_load, redis_error, corrupt_value, "+
				"schema_miss, bloom_bypass, stale_write_refused, lock_wait, lock_timeout, wakeup, breaker_open, refresh, "+
				"writes_lost, unconfirmed (an ID absent from the filter's copy answered 503 while Redis or the filter could not "+
				"answer).", []string{"guard", "event"}, nil),
		ready: prometheus.NewDesc(name("filter_ready"),
			"1 while the bloom filter answers, 0 while the Guard fails open (its last probe found the filter not ready).", g, nil),
		unwritten: prometheus.NewDesc(name("unwritten"),
			"IDs whose write did not reach Redis and waits for its replay (+1 while the set overflowed): alert when it stays above 0.", g, nil),
		copyBytes: prometheus.NewDesc(name("filter_copy_bytes"),
			"Bytes of the bloom filter's copy in process memory, which judges IDs while Redis or the filter cannot (0: none).", g, nil),
		fill:         prometheus.NewDesc(name("bloom_fill_ratio"), "Share of the bloom filter's bits set.", g, nil),
		fpRate:       prometheus.NewDesc(name("bloom_estimated_fp_rate"), "The bloom filter's estimated false-positive rate at its fill.", g, nil),
		items:        prometheus.NewDesc(name("bloom_added_items"), "Items loaded by the last rebuild plus items added since.", g, nil),
		memory:       prometheus.NewDesc(name("bloom_memory_bytes"), "Redis memory of the bloom filter's shards.", g, nil),
		scrapeErrors: prometheus.NewDesc(name("bloom_info_errors"), "1 when the filter could not be read during this scrape.", g, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gets, c.coalesced, c.events, c.ready, c.unwritten, c.copyBytes, c.fill, c.fpRate, c.items,
		c.memory, c.scrapeErrors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.guards {
		c.collectStats(ch, g)
		if !c.opts.SkipFilterInfo {
			c.collectInfo(ch, g)
		}
	}
}

func (c *Collector) collectStats(ch chan<- prometheus.Metric, g *guard.Guard) {
	st, name := g.Stats(), g.Name()
	for _, o := range []struct {
		outcome string
		n       uint64
	}{
		{guard.OutcomeHit, st.Hits}, {guard.OutcomeLocalHit, st.LocalHits}, {guard.OutcomeMarker, st.EmptyHits},
		{guard.OutcomeReject, st.BloomRejects}, {guard.OutcomeMiss, st.Misses},
	} {
		ch <- prometheus.MustNewConstMetric(c.gets, prometheus.CounterValue, float64(o.n), name, o.outcome)
	}
	ch <- prometheus.MustNewConstMetric(c.coalesced, prometheus.CounterValue, float64(st.Coalesced), name)
	for _, e := range []struct {
		event string
		n     uint64
	}{
		{"load", st.Loads}, {"load_error", st.LoadErrors}, {"load_through", st.LoadThroughs}, {"shed", st.Shed},
		{"abandoned_load", st.AbandonedLoads}, {"redis_error", st.RedisErrors}, {"corrupt_value", st.CorruptValues},
		{"schema_miss", st.SchemaMisses},
		{"bloom_bypass", st.BloomBypasses}, {"stale_write_refused", st.StaleWrites}, {"lock_wait", st.LockWaits},
		{"lock_timeout", st.LockTimeouts}, {"wakeup", st.Wakeups}, {"breaker_open", st.BreakerOpens}, {"refresh", st.Refreshes},
		{"writes_lost", st.WritesLost}, {"unconfirmed", st.Unconfirmed},
	} {
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(e.n), name, e.event)
	}
	ready := 1.0
	if st.FilterNotReady {
		ready = 0
	}
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, ready, name)
	ch <- prometheus.MustNewConstMetric(c.unwritten, prometheus.GaugeValue, float64(st.Unwritten), name)
	ch <- prometheus.MustNewConstMetric(c.copyBytes, prometheus.GaugeValue, float64(st.FilterCopy), name)
}

func (c *Collector) collectInfo(ch chan<- prometheus.Metric, g *guard.Guard) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.InfoTimeout)
	defer cancel()
	name := g.Name()
	in, err := g.Info(ctx)
	if err != nil {
		// The counters above still go out; the filter shows as unreadable.
		ch <- prometheus.MustNewConstMetric(c.scrapeErrors, prometheus.GaugeValue, 1, name)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeErrors, prometheus.GaugeValue, 0, name)
	ch <- prometheus.MustNewConstMetric(c.fill, prometheus.GaugeValue, in.FillRatio, name)
	ch <- prometheus.MustNewConstMetric(c.fpRate, prometheus.GaugeValue, in.EstimatedFPRate, name)
	ch <- prometheus.MustNewConstMetric(c.items, prometheus.GaugeValue, float64(in.Added), name)
	ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(in.MemoryBytes), name)
}
