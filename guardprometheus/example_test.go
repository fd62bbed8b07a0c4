package guardprometheus_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/guardprometheus"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func ExampleNew() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-prom", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)
	load := func(ctx context.Context, id string) (string, error) { return "Desk lamp", nil }
	for _, id := range []string{"42", "42", "7"} {
		_, _ = guard.Get(ctx, g, id, load)
	}

	reg := prometheus.NewRegistry() // the application's own; serve it with promhttp.HandlerFor
	reg.MustRegister(guardprometheus.New(nil, g))

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP cacheguard_gets_total Get calls (and GetMany IDs) answered, by outcome: hit, local_hit, marker, reject, miss.
# TYPE cacheguard_gets_total counter
cacheguard_gets_total{guard="example-prom",outcome="hit"} 1
cacheguard_gets_total{guard="example-prom",outcome="local_hit"} 0
cacheguard_gets_total{guard="example-prom",outcome="marker"} 0
cacheguard_gets_total{guard="example-prom",outcome="miss"} 1
cacheguard_gets_total{guard="example-prom",outcome="reject"} 1
`), "cacheguard_gets_total")
	fmt.Println(err)
	// Output: <nil>
}
