package bloom_test

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// sameAnswers fails t unless the copy answers every ID of probe as Redis
// does.
func sameAnswers(t *testing.T, f *bloom.Filter, probe []string) {
	t.Helper()
	want, err := f.TestMany(context.Background(), probe)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range probe {
		if got, ok := f.TestCopy(id); !ok || got != want[i] {
			t.Fatalf("copy says %v (held %v) for %s, redis %v", got, ok, id, want[i])
		}
	}
}

// TestCopyAnswersAsRedis: the copy answers every ID as the filter in Redis
// does, across shards and 1 MiB chunks, follows this client's Adds at
// once and another's at the next refresh, survives the filter's loss, and
// follows a rebuild into another layout.
func TestCopyAnswersAsRedis(t *testing.T) {
	ctx := context.Background()
	for _, o := range []*bloom.Options{
		{ExpectedItems: 1_000_000},                      // one shard of 1.26 MB: two chunks
		{ExpectedItems: 20_000, MaxShardBytes: 1 << 10}, // 25 shards
	} {
		c, f := openFilter(t, o)
		if _, ok := f.TestCopy("k1"); ok {
			t.Fatal("a copy before any refresh")
		}
		if _, err := f.RefreshCopy(ctx); !errors.Is(err, bloom.ErrNotReady) {
			t.Fatalf("refresh of a filter never built: %v", err)
		}
		if _, err := f.Rebuild(ctx, seq("k", 10_000), nil); err != nil {
			t.Fatal(err)
		}
		size, err := f.RefreshCopy(ctx)
		if err != nil || uint64(size) != f.Config().Bits/8 {
			t.Fatalf("refresh: %d bytes, %v; want %d", size, err, f.Config().Bits/8)
		}
		probe := append(ids("k", 0, 10_000), ids("u", 0, 20_000)...)
		sameAnswers(t, f, probe)

		other, err := bloom.Open(ctx, c, c.Prefix+":bf", o) // another process
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Add(ctx, "mine"); err != nil {
			t.Fatal(err)
		}
		if err := other.Add(ctx, "theirs"); err != nil {
			t.Fatal(err)
		}
		if maybe, _ := f.TestCopy("mine"); !maybe {
			t.Fatal("this client's Add is not in its copy")
		}
		if maybe, _ := f.TestCopy("theirs"); maybe {
			t.Skip("\"theirs\" is a false positive of this layout") // deterministic: fixed hashes
		}
		if _, err := f.RefreshCopy(ctx); err != nil {
			t.Fatal(err)
		}
		if maybe, _ := f.TestCopy("theirs"); !maybe {
			t.Fatal("another client's Add is not in the copy after a refresh")
		}

		// Redis loses a shard: the refresh fails and the copy stays.
		gen, _ := f.CopyInfo()
		if err := c.Del(ctx, keyspace.ForFilter(c.Prefix+":bf").Shard(gen, 0)).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := f.RefreshCopy(ctx); !errors.Is(err, bloom.ErrNotReady) {
			t.Fatalf("refresh of a lost filter: %v", err)
		}
		if maybe, ok := f.TestCopy("k7"); !ok || !maybe {
			t.Fatal("the copy was dropped with the filter")
		}

		// A rebuild resized: the copy follows into the new layout.
		if _, err := f.Rebuild(ctx, seq("k", 10_000), &bloom.RebuildOptions{ExpectedItems: 50_000, Force: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.RefreshCopy(ctx); err != nil {
			t.Fatal(err)
		}
		if now, _ := f.CopyInfo(); now == gen {
			t.Fatalf("after a rebuild the copy is still of generation %d", gen)
		}
		sameAnswers(t, f, probe)
	}
}

// BenchmarkCopyMemory measures what the copy of a filter sized for a
// million IDs at 1% costs a process (heap held after a refresh, per ID and
// per million IDs), and how long a first fetch takes.
// go test -run '^$' -bench CopyMemory -benchtime 3x ./bloom
func BenchmarkCopyMemory(b *testing.B) {
	ctx := context.Background()
	const n = 1_000_000
	c := redistest.Connect(b)
	f, err := bloom.Open(ctx, c, c.Prefix+":bf", &bloom.Options{ExpectedItems: n, FalsePositiveRate: 0.01})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.Rebuild(ctx, seq("k", n), nil); err != nil {
		b.Fatal(err)
	}
	var held float64
	for b.Loop() {
		b.StopTimer()
		fresh, err := bloom.Open(ctx, c, c.Prefix+":bf", nil) // another process: no copy yet
		if err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		if _, err := fresh.RefreshCopy(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		held = float64(after.HeapAlloc) - float64(before.HeapAlloc)
		if maybe, _ := fresh.TestCopy("k1"); !maybe {
			b.Fatal("k1 not in the copy")
		}
		b.StartTimer()
	}
	b.ReportMetric(held/n, "B/ID")
	b.ReportMetric(held/(1<<20), "MiB/1M-IDs")
}
