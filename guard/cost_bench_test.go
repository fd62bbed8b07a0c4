//go:build unix

package guard_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/cputime"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// BenchmarkCost is the CPU a Get costs, split between this process and
// redis-server, next to what a naive cache-aside read costs (GET; on a miss
// the load and a SET): 16 goroutines, every miss on an ID read for the first
// time. It reports client-cpu-µs/op (this process: user + system time,
// getrusage) and redis-cpu-µs/op (the server's used_cpu_user + used_cpu_sys,
// INFO cpu, over the same span; the harness's server serves nothing else
// meanwhile). On a machine whose cores are all busy, throughput follows the
// sum of the two.
//
// A guarded miss costs more than a naive one by construction: three round
// trips against two (read; lock attempt and re-check; checked write, release
// and publish) and one Lua script. That is the price of one load per key
// across processes and of never caching a value that a write overtook;
// under ordinary traffic it is paid on the misses only.
func BenchmarkCost(b *testing.B) {
	ctx := context.Background()
	const known = 1_000_000 // IDs in the filter: a miss is on an ID not read before
	c := redistest.Connect(b)
	rdb := redistest.NewClient() // without the counting hook
	b.Cleanup(func() { _ = rdb.Close() })
	g, err := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: known}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	if _, err := g.Rebuild(ctx, ids("p", known), nil); err != nil {
		b.Fatal(err)
	}
	load := func(_ context.Context, id string) (product, error) {
		return product{ID: id, Name: "product " + id, Price: len(id)}, nil
	}
	naive := func(prefix string) func(i int) {
		return func(i int) {
			id := "p" + strconv.Itoa(i)
			k := prefix + id
			raw, err := rdb.Get(ctx, k).Bytes()
			var p product
			switch {
			case err == nil:
				if err := msgpack.Unmarshal(raw, &p); err != nil {
					b.Error(err)
				}
				return
			case err != redis.Nil:
				b.Error(err)
				return
			}
			p, _ = load(ctx, id)
			raw, _ = msgpack.Marshal(p)
			if err := rdb.Set(ctx, k, raw, time.Hour).Err(); err != nil {
				b.Error(err)
			}
		}
	}
	guarded := func(i int) {
		if _, err := guard.Get(ctx, g, "p"+strconv.Itoa(i), load); err != nil {
			b.Error(err)
		}
	}
	// The miss runs read IDs never read before (the testing package calls
	// each sub-benchmark several times, with growing b.N: the cursor goes
	// on across the calls); the hit runs read the IDs the misses filled.
	var guardedFilled, naiveFilled int
	b.Run("guard-miss", func(b *testing.B) { guardedFilled = costRun(b, c, g, guarded, &guardedFilled, known) })
	b.Run("naive-miss", func(b *testing.B) { naiveFilled = costRun(b, c, g, naive(c.Prefix+":naive:"), &naiveFilled, known) })
	b.Run("guard-hit", func(b *testing.B) { var zero int; costRun(b, c, g, guarded, &zero, guardedFilled) })
	b.Run("naive-hit", func(b *testing.B) { var zero int; costRun(b, c, g, naive(c.Prefix+":naive:"), &zero, naiveFilled) })
}

// costRun runs op on b.N IDs from *cursor on (wrapping to 0 at limit: the
// miss runs never get that far at the default -benchtime) in 16 goroutines,
// reports the CPU per op of this process and of redis-server, and returns
// the cursor after them (at most limit). It waits for g's flights before it
// reads the CPU: a miss's write follows its answer.
func costRun(b *testing.B, c redis.UniversalClient, g *guard.Guard, op func(i int), cursor *int, limit int) int {
	if limit == 0 {
		b.Skip("nothing to read: the miss run before it did not run")
	}
	from := *cursor
	var next atomic.Int64
	r0, s0 := redisCPU(b, c), cputime.Process()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1)) - 1
			op((from + i) % limit)
		}
	})
	b.StopTimer()
	if err := guard.Flush(context.Background(), g); err != nil { // the writes after the last misses' answers count too
		b.Fatal(err)
	}
	r1, s1 := redisCPU(b, c), cputime.Process()
	n := float64(b.N)
	b.ReportMetric(float64((s1-s0).Microseconds())/n, "client-cpu-µs/op")
	b.ReportMetric((r1-r0)*1e6/n, "redis-cpu-µs/op")
	return min(from+b.N, limit)
}

// redisCPU is the server's CPU time so far, in seconds (summed over the
// nodes in a cluster).
func redisCPU(b *testing.B, c redis.UniversalClient) float64 {
	d, err := cputime.Redis(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return d.Seconds()
}
