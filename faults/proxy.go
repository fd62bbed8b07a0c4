// Package faults is cacheguard's fault suite: real redis-server processes
// (standalone, a Redis Cluster, TLS) are killed, frozen, flushed, filled up
// and slowed down under traffic, and every scenario checks that Gets return
// no wrong value and no false "not found", and records how long the worst
// Get took, how long the Guard took to recover and how many loads reached
// the source of truth during the outage. `make test` runs it; README has the
// table.
//
// Proxy puts Shopify's toxiproxy, run in-process as a library, between a
// client and Redis, to inject latency, a blackhole or connection resets. It
// lives in its own module so that toxiproxy's dependencies stay out of the
// library's go.mod.
package faults

import (
	"context"
	"fmt"
	"strings"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy to upstream on 127.0.0.1 whose traffic can be
// degraded. It is safe for concurrent use.
type Proxy struct {
	// Addr is where clients connect ("127.0.0.1:port").
	Addr string
	p    *toxiproxy.Proxy
}

// NewProxy starts a proxy to upstream (host:port) on a free local port.
func NewProxy(upstream string) (*Proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	srv.Metrics.ProxyMetrics = collectors.NewProxyMetricCollectors()
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("faults: proxy: %w", err)
	}
	return &Proxy{Addr: p.Listen, p: p}, nil
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() { p.p.Stop() }

// Latency delays every reply by d (in milliseconds).
func (p *Proxy) Latency(ms int) error {
	return p.add(fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":%d}}`, ms))
}

// Blackhole stops delivering replies (the connections stay open, silent),
// as a frozen network path does.
func (p *Proxy) Blackhole() error {
	return p.add(`{"name":"blackhole","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
}

// Reset resets every connection (TCP RST) as soon as data flows.
func (p *Proxy) Reset() error {
	return p.add(`{"name":"reset","type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`)
}

// Clear removes every toxic: traffic flows normally again.
func (p *Proxy) Clear() {
	for _, name := range []string{"latency", "blackhole", "reset"} {
		_ = p.p.Toxics.RemoveToxic(context.Background(), name)
	}
}

func (p *Proxy) add(spec string) error {
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		return fmt.Errorf("faults: toxic: %w", err)
	}
	return nil
}
