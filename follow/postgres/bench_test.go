package pgfollow_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/cmdcount"
	"github.com/cacheguard/cacheguard/internal/cputime"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// BenchmarkFollow: 4 writers commit 20,000 single-row UPDATEs as fast as
// PostgreSQL takes them, on 20,000 cached rows; one op is one UPDATE,
// timed from the first commit until the follower has applied the last.
// commits/s is the writers' own rate: the follower keeps up when its
// changes/s is not below it. With the inspector off, and at its default.
func BenchmarkFollow(b *testing.B) {
	withInspector(b, benchFollow)
}

// withInspector runs bench with the inspector off, then at its default.
func withInspector(b *testing.B, bench func(*testing.B, pgfollow.Inspect)) {
	b.Run("inspect=off", func(b *testing.B) { bench(b, pgfollow.Inspect{Rate: -1}) })
	b.Run("inspect=default", func(b *testing.B) { bench(b, pgfollow.Inspect{}) })
}

func benchFollow(b *testing.B, insp pgfollow.Inspect) {
	const rows, writers = 20_000, 4
	c := redistest.Connect(b)
	fx := newFixture(b, os.Getenv(envPG), c, redistest.Connect(b), c.Prefix, rows)
	fx.insp = insp
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
// applied the backlog: how fast it drains a lag. With the inspector off,
// and at its default.
func BenchmarkCatchUp(b *testing.B) {
	withInspector(b, benchCatchUp)
}

func benchCatchUp(b *testing.B, insp pgfollow.Inspect) {
	const rows = 20_000
	c := redistest.Connect(b)
	fx := newFixture(b, os.Getenv(envPG), c, redistest.Connect(b), c.Prefix, rows)
	fx.insp = insp
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

// BenchmarkInspect: the inspector's cost per check of one sampled ID, read
// back as it reads them (256 IDs per round trip, of cached rows): round
// trips, and the CPU of this process and of redis-server. A sampled change
// costs one check per delay (two by default); the default rate samples 1%.
func BenchmarkInspect(b *testing.B) {
	const rows, batch = 10_000, 256
	c := redistest.Connect(b)
	fx := newFixture(b, os.Getenv(envPG), c, redistest.Connect(b), c.Prefix, rows)
	var cnt cmdcount.Counter
	rdb := redistest.Connect(b)
	rdb.AddHook(&cnt)
	e := fx.guard(rdb).Feed()
	fx.warm(rows)
	ids := make([]string, batch)
	ctx := context.Background()
	redisCPU, err := cputime.Redis(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	cpu := cputime.Process()
	cnt.Reset()
	n := 0
	for b.Loop() {
		for i := range ids {
			ids[i] = fmt.Sprintf("id%d", (n+i)%rows)
		}
		held, err := e.Inspect(ctx, ids)
		if err != nil || len(held) != batch || held[0].Values != 1 {
			b.Fatalf("Inspect: %v, %+v", err, held[:1])
		}
		n += batch
	}
	redisAfter, err := cputime.Redis(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	b.ReportMetric(float64(cnt.RoundTrips())/float64(n), "trips/check")
	b.ReportMetric(per(cputime.Process()-cpu), "client-µs/check")
	b.ReportMetric(per(redisAfter-redisCPU), "redis-µs/check")
	b.ReportMetric(float64(b.Elapsed())/float64(n), "ns/check")
	b.ReportMetric(0, "ns/op")
}
