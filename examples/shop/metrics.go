package main

import (
	"context"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/guardprometheus"
	"github.com/cacheguard/cacheguard/internal/cputime"
)

// telemetry is the shop's own Prometheus registry (no global state, no
// per-ID labels) and the OpenTelemetry meter provider its Guards report to:
// guardprometheus.Collector (every Guard's counters and filter gauges), the
// Guards' OTel histograms through the OTel Prometheus exporter (the counters
// the Collector serves already are dropped by views), the shop's
// shop_db_queries_total{path} and shop_redis_commands_total{path}, and the
// process's and redis-server's CPU seconds, from which the demo computes
// each path's CPU per request.
type telemetry struct {
	reg   *prometheus.Registry
	meter *sdkmetric.MeterProvider
}

func newTelemetry() (*telemetry, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithNamespace("otel"), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	drop := func(name string) sdkmetric.View {
		return sdkmetric.NewView(sdkmetric.Instrument{Name: name}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}})
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter),
		sdkmetric.WithView(drop("cacheguard.gets"), drop("cacheguard.bloom.*")))
	return &telemetry{reg: reg, meter: mp}, nil
}

// registerMetrics adds the Guards' Collector and the shop's own counters.
func (s *Shop) registerMetrics() {
	guards := []*guard.Guard{s.products, s.users}
	for _, v := range s.variants {
		guards = append(guards, v.g)
	}
	s.tel.reg.MustRegister(guardprometheus.New(nil, guards...),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shop_redis_cpu_seconds_total",
			Help: "CPU seconds redis-server has used (INFO cpu: used_cpu_user + used_cpu_sys); NaN if Redis did not answer."},
			s.redisCPU))
	paths := []struct {
		label   string
		queries func() int64
		cmds    func() int64
	}{
		{"guard", s.store.queries.Load, s.guardCmds.Commands},
		{"naive", s.naiveStore.queries.Load, s.naiveCmd.Commands},
	}
	for _, v := range s.variants {
		paths = append(paths, struct {
			label   string
			queries func() int64
			cmds    func() int64
		}{v.label, v.store.queries.Load, v.cmds.Commands})
	}
	for _, p := range paths {
		labels := prometheus.Labels{"path": p.label}
		s.tel.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shop_db_queries_total", Help: "Database queries, by request path.", ConstLabels: labels},
				func() float64 { return float64(p.queries()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shop_redis_commands_total", Help: "Redis commands sent, by request path.", ConstLabels: labels},
				func() float64 { return float64(p.cmds()) }),
		)
	}
}

// redisCPU is redis-server's CPU time so far, in seconds (NaN when Redis
// does not answer within a second).
func (s *Shop) redisCPU() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := cputime.Redis(ctx, s.guardRDB)
	if err != nil {
		return math.NaN()
	}
	return d.Seconds()
}

// metrics serves the registry in the Prometheus text format.
func (s *Shop) metrics() http.Handler {
	return promhttp.HandlerFor(s.tel.reg, promhttp.HandlerOpts{})
}

func (t *telemetry) close(ctx context.Context) error { return t.meter.Shutdown(ctx) }
