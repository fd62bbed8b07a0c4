package pgfollow_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// BenchmarkFollow: 4 writers commit 20,000 single-row UPDATEs as fast as
// PostgreSQL takes them, on 20,000 cached rows; one op is one UPDATE,
// timed from the first commit until the follower has applied the last.
// commits/s is the writers' own rate: the follower keeps up when its
// changes/s is not below it.
func BenchmarkFollow(b *testing.B) {
	const rows, writers = 20_000, 4
	c := redistest.Connect(b)
	fx := newFixture(b, os.Getenv(envPG), c, redistest.Connect(b), c.Prefix, rows)
	fx.warm(rows)
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.caughtUp(f)
	var commit, apply time.Duration
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for i := w; i < rows; i += writers {
					if _, err := fx.pool.Exec(context.Background(), "UPDATE "+fx.name+" SET v = v + 1 WHERE id = $1", fmt.Sprintf("id%d", i)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		commit += time.Since(start)
		fx.caughtUp(f)
		apply += time.Since(start)
	}
	n := float64(b.N * rows)
	b.ReportMetric(n/commit.Seconds(), "commits/s")
	b.ReportMetric(n/apply.Seconds(), "changes/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCatchUp: 20,000 single-row UPDATEs committed while no follower
// runs; one op is one UPDATE, timed from a follower's start until it has
// applied the backlog: how fast it drains a lag.
func BenchmarkCatchUp(b *testing.B) {
	const rows = 20_000
	c := redistest.Connect(b)
	fx := newFixture(b, os.Getenv(envPG), c, redistest.Connect(b), c.Prefix, rows)
	fx.warm(rows)
	g := fx.guard(fx.rdb)
	var apply time.Duration
	for b.Loop() {
		b.StopTimer()
		fx.exec("UPDATE " + fx.name + " SET v = v + 1") // one transaction of 20,000 changes
		for i := range 2 {
			fx.burst(i*rows/2, rows/4, nil) // and 10,000 transactions of one
		}
		b.StartTimer()
		start := time.Now()
		f, stop := fx.follow(g)
		fx.caughtUp(f)
		apply += time.Since(start)
		stop()
	}
	b.ReportMetric(float64(b.N*(rows+rows/2))/apply.Seconds(), "changes/s")
	b.ReportMetric(0, "ns/op")
}
