package guard_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// The Get benchmarks run against the harness's redis-server on a unix socket.
// Compare each with BenchmarkRawGet: the ratio is the guard's overhead on top
// of the round trip every cache-aside read pays anyway.

// benchGuard opens a Guard (opts on top of the harness's prefix and
// 100,000 expected items; nil: defaults) on a client without the counting
// hook, as BenchmarkRawGet's, and fills its filter with p0..p<known-1>.
func benchGuard(b *testing.B, known int, opts *guard.Options) (*redistest.Conn, *guard.Guard, *db) {
	b.Helper()
	c := redistest.Connect(b)
	rdb := redistest.NewClient()
	b.Cleanup(func() { _ = rdb.Close() })
	var o guard.Options
	if opts != nil {
		o = *opts
	}
	o.KeyPrefix, o.Filter.ExpectedItems = c.Prefix, 100_000
	g, err := guard.New(context.Background(), rdb, "product", &o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	d := newDB(known)
	if _, err := g.Rebuild(context.Background(), ids("p", known), nil); err != nil {
		b.Fatal(err)
	}
	// Rebuild refreshed the filter's copy before it returned: no fetch of
	// it lands in the timed Gets.
	if g.Stats().FilterCopy == 0 {
		b.Fatal("no copy of the filter after its rebuild")
	}
	return c, g, d
}

// warm Gets p0..p999 once (each a miss that caches it) and returns their IDs.
func warm(b *testing.B, g *guard.Guard, d *db) []string {
	b.Helper()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("p%d", i)
		if _, err := guard.Get(context.Background(), g, keys[i], d.load); err != nil {
			b.Fatal(err)
		}
	}
	if err := guard.Flush(context.Background(), g); err != nil { // the last misses' writes
		b.Fatal(err)
	}
	return keys
}

// hits times Gets of warm keys on ctx, in the benchmark's goroutine
// (workers 0) or in workers goroutines.
func hits(ctx context.Context, b *testing.B, g *guard.Guard, d *db, keys []string, workers int) {
	b.ReportAllocs()
	b.ResetTimer() // the warm-up's misses are not hits
	if workers == 0 {
		i := 0
		for b.Loop() {
			if _, err := guard.Get(ctx, g, keys[i%len(keys)], d.load); err != nil {
				b.Fatal(err)
			}
			i++
		}
		return
	}
	// As RunParallel, with each goroutine's loop state on its own stack:
	// RunParallel's per-goroutine counter (testing.PB, 32 bytes, written at
	// every iteration) could share a cache line with another goroutine's,
	// which moved the 80 ns of a local hit by a quarter from build to build.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			const grain = 1000
			for {
				end := next.Add(grain)
				for i := end - grain; i < min(end, int64(b.N)); i++ {
					if _, err := guard.Get(ctx, g, keys[int(i)%len(keys)], d.load); err != nil {
						b.Error(err)
						return
					}
				}
				if end >= int64(b.N) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	b.Run("hit", func(b *testing.B) {
		_, g, d := benchGuard(b, 1000, nil)
		hits(ctx, b, g, d, warm(b, g, d), 0)
	})
	// hit-otel is hit with OpenTelemetry on: an SDK tracer provider that
	// samples every span (and exports none) and an SDK meter provider
	// with a reader. Compare with hit (no providers: nothing recorded).
	b.Run("hit-otel", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = tp.Shutdown(ctx); _ = mp.Shutdown(ctx) })
		_, g, d := benchGuard(b, 1000, &guard.Options{Telemetry: guard.TelemetryOptions{TracerProvider: tp, MeterProvider: mp}})
		hits(ctx, b, g, d, warm(b, g, d), 0)
	})
	b.Run("reject", func(b *testing.B) {
		_, g, d := benchGuard(b, 1000, nil)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := guard.Get(ctx, g, fmt.Sprintf("u%d", i%100_000), d.load); err == nil {
				b.Fatal("unknown ID found")
			}
			i++
		}
	})
	// A flood of unknown IDs from 16 goroutines, without and with the local
	// cache (whose reads also carry the entry's PTTL and are shared).
	for _, tc := range []struct {
		name string
		opts *guard.Options
	}{{"reject-parallel", nil}, {"reject-local-parallel", &guard.Options{Local: &guard.LocalOptions{}}}} {
		b.Run(tc.name, func(b *testing.B) {
			_, g, d := benchGuard(b, 1000, tc.opts)
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8) // 16 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := guard.Get(ctx, g, fmt.Sprintf("u%d", n.Add(1)), d.load); err == nil {
						b.Error("unknown ID found")
						return
					}
				}
			})
		})
	}
	b.Run("miss", func(b *testing.B) {
		c, g, d := benchGuard(b, 1000, nil)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			b.StopTimer()
			id := fmt.Sprintf("p%d", i%1000)
			c.Del(ctx, c.Prefix+":product:{"+id+"}")
			b.StartTimer()
			if _, err := guard.Get(ctx, g, id, d.load); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("local-hit-parallel", func(b *testing.B) {
		_, g, d := benchGuard(b, 1000, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
		hits(ctx, b, g, d, warm(b, g, d), runtime.GOMAXPROCS(0))
	})
	b.Run("hit-parallel", func(b *testing.B) {
		_, g, d := benchGuard(b, 1000, nil)
		hits(ctx, b, g, d, warm(b, g, d), runtime.GOMAXPROCS(0))
	})
	// hit-64: the tight loop docs/benchmarks.md compares with go-redis's
	// AutoPipeline GET: 64 goroutines, no pause, no deadline. Its
	// counterpart is BenchmarkRawGet/autopipeline-64.
	b.Run("hit-64", func(b *testing.B) {
		_, g, d := benchGuard(b, 1000, nil)
		hits(ctx, b, g, d, warm(b, g, d), 64)
	})
	// hit-deadline-64: 64 goroutines whose Gets carry a request's deadline,
	// on a client without ContextTimeoutEnabled (redistest's): each read
	// runs detached and its caller waits at most half its time (sendRead).
	b.Run("hit-deadline-64", func(b *testing.B) {
		_, g, d := benchGuard(b, 1000, nil)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		hits(ctx, b, g, d, warm(b, g, d), 64)
	})
}

// BenchmarkRawGet is the floor: a plain go-redis GET of the same bytes, with
// and without decoding them; autopipeline-64 sends it through go-redis's
// AutoPipeline, as hit-64's reference.
func BenchmarkRawGet(b *testing.B) {
	ctx := context.Background()
	c := redistest.Connect(b)
	rdb := redistest.NewClient() // a client without the counting hook
	defer rdb.Close()
	payload, _ := msgpack.Marshal(product{ID: "p1", Name: "product p1", Price: 1})
	for i := range 1000 {
		rdb.Set(ctx, fmt.Sprintf("%s:%d", c.Prefix, i), payload, 0)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s:%d", c.Prefix, i)
	}
	b.Run("bytes", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := rdb.Get(ctx, keys[i%1000]).Err(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := decoded(rdb.Get(ctx, keys[i%1000])); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	// autopipeline-64: the same GET and decoding through go-redis's
	// AutoPipeline (default options) in 64 goroutines, hit-64's counterpart.
	b.Run("autopipeline-64", func(b *testing.B) {
		c, ok := rdb.(interface {
			AutoPipeline() (*redis.AutoPipeliner, error)
		})
		if !ok {
			b.Fatalf("%T has no AutoPipeline", rdb)
		}
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		defer ap.Close()
		var next atomic.Int64
		var wg sync.WaitGroup
		b.ReportAllocs()
		b.ResetTimer()
		for range 64 { // as hits, with the AutoPipeliner's GET
			wg.Go(func() {
				const grain = 1000
				for {
					end := next.Add(grain)
					for i := end - grain; i < min(end, int64(b.N)); i++ {
						if err := decoded(ap.Get(ctx, keys[i%1000])); err != nil {
							b.Error(err)
							return
						}
					}
					if end >= int64(b.N) {
						return
					}
				}
			})
		}
		wg.Wait()
	})
	b.Run("decode-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if err := decoded(rdb.Get(ctx, keys[i%1000])); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}

// decoded decodes a GET's reply into a product, as a cache-aside read does.
func decoded(get *redis.StringCmd) error {
	raw, err := get.Bytes()
	if err != nil {
		return err
	}
	var p product
	return msgpack.Unmarshal(raw, &p)
}

// BenchmarkGetMany: a page of 100 warm IDs through GetMany (one round trip)
// against 100 Gets and against the floor, a pipeline of 100 plain GETs of
// the same bytes with their decoding.
func BenchmarkGetMany(b *testing.B) {
	ctx := context.Background()
	c, g, d := benchGuard(b, 1000, nil)
	var page []string
	for i := range 100 {
		page = append(page, fmt.Sprintf("p%d", i))
	}
	bd := &batchDB{db: d}
	if _, err := guard.GetMany(ctx, g, page, bd.loadMany); err != nil {
		b.Fatal(err)
	}
	b.Run("GetMany-100", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if m, err := guard.GetMany(ctx, g, page, bd.loadMany); err != nil || len(m) != 100 {
				b.Fatal(len(m), err)
			}
		}
	})
	b.Run("Get-x100", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, id := range page {
				if _, err := guard.Get(ctx, g, id, d.load); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("raw-pipelined-GET-x100", func(b *testing.B) {
		rdb := redistest.NewClient()
		defer rdb.Close()
		payload, _ := msgpack.Marshal(product{ID: "p1", Name: "product p1", Price: 1})
		keys := make([]string, len(page))
		for i := range keys {
			keys[i] = fmt.Sprintf("%s:raw:%d", c.Prefix, i)
			rdb.Set(ctx, keys[i], payload, 0)
		}
		b.ReportAllocs()
		for b.Loop() {
			pipe := rdb.Pipeline()
			cmds := make([]*redis.StringCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.Get(ctx, k)
			}
			_, _ = pipe.Exec(ctx)
			for _, cmd := range cmds {
				var p product
				raw, _ := cmd.Bytes()
				if err := msgpack.Unmarshal(raw, &p); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
