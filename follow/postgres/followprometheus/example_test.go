package followprometheus_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/follow/postgres/followprometheus"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// The follower's metrics on the application's registry. pgfollow.New does
// not connect: before Run, a scrape shows a follower that has applied
// nothing; the inspector's series appear per table and delay once it has
// checked an ID.
func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: "example-followprom"})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	f, err := pgfollow.New("postgres://follower@db/shop", []pgfollow.Table{{Name: "products", Guard: g}}, nil)
	if err != nil {
		panic(err)
	}
	// go f.Run(ctx) follows the slot.

	reg := prometheus.NewRegistry() // the application's own; serve it with promhttp.HandlerFor
	reg.MustRegister(followprometheus.New(f))

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		fmt.Println(mf.GetName(), mf.GetType())
	}
	// Output:
	// cacheguard_pgfollow_changes_total COUNTER
	// cacheguard_pgfollow_following GAUGE
	// cacheguard_pgfollow_lag_bytes GAUGE
	// cacheguard_pgfollow_lag_seconds GAUGE
	// cacheguard_pgfollow_retries_total COUNTER
	// cacheguard_pgfollow_rollbacks_total COUNTER
	// cacheguard_pgfollow_standby GAUGE
}
