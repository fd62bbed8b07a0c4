package pgfollow_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/guard"
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
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.warm(rows)
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
	g := fx.guard(fx.rdb)
	_, stop := fx.follow(g) // a first start drops the entries: done before the timing
	stop()
	fx.warm(rows)
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

// BenchmarkLag: one writer commits 1,000 single-row UPDATEs per second for
// 30 s, each of a row cached in two readers (Guards on clients of their own,
// as in two other processes). A commit's lag runs from its COMMIT returning
// until both readers answer the new value (polled every 500 µs); p50, p99
// and max are reported. Run with -benchtime 1x: one op is the 30 s.
func BenchmarkLag(b *testing.B) {
	const rate, seconds = 1_000, 30
	const rows = rate * seconds
	c := redistest.Connect(b)
	fx := newFixture(b, os.Getenv(envPG), c, redistest.Connect(b), c.Prefix, rows)
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.warm(rows)
	second := fx.guard(redistest.Connect(b))
	ids := make([]string, rows)
	for i := range ids {
		ids[i] = fmt.Sprintf("id%d", i)
	}
	for len(ids) > 0 { // cached in the second reader too
		n := min(len(ids), 500)
		if m, err := guard.GetMany(context.Background(), second, ids[:n], fx.loadMany); err != nil || len(m) != n {
			b.Fatalf("GetMany: %d rows, %v", len(m), err)
		}
		ids = ids[n:]
	}
	fx.caughtUp(f)
	readers := []*guard.Guard{fx.reader, second}
	load := func(ctx context.Context, id string) (int, error) { // fx.load counts, one Get at a time
		var v int
		err := fx.pool.QueryRow(ctx, "SELECT v FROM "+fx.name+" WHERE id = $1", id).Scan(&v)
		return v, err
	}
	for b.Loop() {
		lags := make([]time.Duration, rows)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range rows {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
			id := fmt.Sprintf("id%d", i)
			fx.exec("UPDATE "+fx.name+" SET v = 1 WHERE id = $1", id)
			committed := time.Now()
			wg.Go(func() {
				for _, g := range readers {
					for {
						v, err := guard.Get(context.Background(), g, id, load)
						if err != nil {
							b.Error(err)
							return
						}
						if v == 1 {
							break
						}
						time.Sleep(500 * time.Microsecond)
					}
				}
				lags[i] = time.Since(committed)
			})
		}
		elapsed := time.Since(start)
		wg.Wait()
		slices.Sort(lags)
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(float64(rows)/elapsed.Seconds(), "commits/s")
		b.ReportMetric(ms(lags[rows/2]), "p50-ms")
		b.ReportMetric(ms(lags[rows*99/100]), "p99-ms")
		b.ReportMetric(ms(lags[rows-1]), "max-ms")
	}
	b.ReportMetric(0, "ns/op")
}
