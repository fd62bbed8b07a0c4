package bloom_test

import (
	"context"
	"errors"
	"testing"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// evictDuringUpload rebuilds key's filter from ids, and at the first upload
// step deletes one key (what an evicting Redis does) and adds "late" (a row
// created meanwhile). It returns Rebuild's error and whether the filter
// then answers "absent" for late.
func evictDuringUpload(t *testing.T, c *redistest.Conn, key string, evict func(gen int64) string) (error, bool) {
	t.Helper()
	ctx := context.Background()
	f, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Rebuild(ctx, seq("k", 1000), nil); err != nil {
		t.Fatal(err)
	}
	in, err := f.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := false
	_, rerr := f.Rebuild(ctx, seq("k", 1000), &bloom.RebuildOptions{ChunkBytes: 1024, Progress: func(p bloom.RebuildProgress) {
		if p.BytesUploaded == 0 || done {
			return
		}
		done = true
		if err := c.Del(ctx, evict(in.Generation+1)).Err(); err != nil {
			t.Error(err)
		}
		if err := f.Add(ctx, "late"); err != nil {
			t.Errorf("Add during the rebuild: %v", err)
		}
	}})
	if !done {
		t.Fatal("the upload never reported progress")
	}
	ok, err := f.Test(ctx, "late")
	if err != nil && !errors.Is(err, bloom.ErrNotReady) {
		t.Fatal(err)
	}
	return rerr, err == nil && !ok
}

// TestNextShardEvictedDuringRebuild: a shard of the generation being built,
// lost while the rebuild uploads, drops the Adds made meanwhile (set_bits
// never recreates a shard). The rebuild must not switch to it; the control
// run, with the merge that ORs into whatever is there, shows the rejection
// the check prevents.
func TestNextShardEvictedDuringRebuild(t *testing.T) {
	c := redistest.Connect(t)
	shard := func(key string) func(int64) string {
		return func(gen int64) string { return keyspace.ForFilter(key).Shard(gen, 0) }
	}
	key := c.Prefix + ":bf"
	err, rejected := evictDuringUpload(t, c, key, shard(key))
	if rejected {
		t.Fatal("an ID added during the rebuild answered absent")
	}
	if err == nil {
		t.Fatal("a rebuild whose new shard was lost switched to it")
	}
	t.Logf("refused: %v", err)

	restore := bloom.WithoutMergeCheck()
	defer restore()
	key = c.Prefix + ":control"
	if err, rejected := evictDuringUpload(t, c, key, shard(key)); err != nil || !rejected {
		t.Fatalf("control (unchecked merge): err %v, rejected %v; want a switch that rejects the late ID", err, rejected)
	}
}

// TestStagingEvictedDuringRebuild: the staging copy lost between two chunks
// lacks the IDs of the chunks before; the merge refuses it.
func TestStagingEvictedDuringRebuild(t *testing.T) {
	c := redistest.Connect(t)
	key := c.Prefix + ":bf"
	staging := func(gen int64) string { return keyspace.Staging(keyspace.ForFilter(key).Shard(gen, 0)) }
	err, rejected := evictDuringUpload(t, c, key, staging)
	if err == nil || rejected {
		t.Fatalf("rebuild err %v, late rejected %v: want a refused rebuild and no rejection", err, rejected)
	}
	// The filter still answers from the generation it had, for every ID.
	f, err := bloom.Open(context.Background(), c, key, &bloom.Options{ExpectedItems: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.TestMany(context.Background(), ids("k", 0, 1000))
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range got {
		if !ok {
			t.Fatalf("k%d answered absent after the refused rebuild", i)
		}
	}
	in, err := f.Info(context.Background())
	if err != nil || in.Rebuilding {
		t.Fatalf("the refused rebuild left its generation announced: %+v, %v", in, err)
	}
}

// TestShortSourceIsRefused: a rebuild from an empty or truncated source
// (a failed query piped into the CLI) would answer "absent" for IDs that
// exist: it is refused, and the filter keeps answering; Force lets it
// through, and a fresh empty filter still builds from nothing.
func TestShortSourceIsRefused(t *testing.T) {
	ctx := context.Background()
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 10_000})
	if n, err := f.Rebuild(ctx, seq("k", 0), nil); err != nil || n != 0 {
		t.Fatalf("a fresh filter from an empty source: %d, %v", n, err)
	}
	if ok, err := f.Test(ctx, "k1"); err != nil || ok {
		t.Fatalf("the empty filter answers %v, %v for k1; want absent", ok, err)
	}
	if _, err := f.Rebuild(ctx, seq("k", 2000), nil); err != nil {
		t.Fatal(err)
	}
	if err := f.AddMany(ctx, ids("new", 0, 2000)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1000, 1900} { // empty; half the last rebuild; under half of what the bits hold
		if _, err := f.Rebuild(ctx, seq("k", n), nil); !errors.Is(err, bloom.ErrShortSource) {
			t.Fatalf("a source of %d IDs for a filter of 4,000: %v; want ErrShortSource", n, err)
		}
		got, err := f.TestMany(ctx, append(ids("k", 0, 2000), ids("new", 0, 2000)...))
		if err != nil {
			t.Fatal(err)
		}
		for i, ok := range got {
			if !ok {
				t.Fatalf("after the refused rebuild from %d IDs, ID %d answered absent", n, i)
			}
		}
	}
	if _, err := f.Rebuild(ctx, seq("k", 2100), nil); err != nil {
		t.Fatalf("a source of more than half: %v", err)
	}
	if _, err := f.Rebuild(ctx, seq("k", 10), &bloom.RebuildOptions{Force: true}); err != nil {
		t.Fatalf("Force: %v", err)
	}
	if ok, err := f.Test(ctx, "k5"); err != nil || !ok {
		t.Fatalf("after the forced rebuild k5: %v, %v", ok, err)
	}
}

// TestLostMetaIsPutBack: an evicting Redis drops the meta (read at open and
// rebuild only, so LRU finds it cold) while the shards keep answering. Info
// and Add put it back from the client's layout: the filter stays ready, its
// generation and count kept, with no rebuild.
func TestLostMetaIsPutBack(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	key := c.Prefix + ":bf"
	f, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := f.Rebuild(ctx, seq("k", 1000), nil); err != nil {
			t.Fatal(err)
		}
	}
	before, err := f.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, heal := range []func() error{
		func() error { _, err := f.Info(ctx); return err },
		func() error { return f.Add(ctx, "k1") },
	} {
		if err := c.Del(ctx, keyspace.ForFilter(key).Meta()).Err(); err != nil {
			t.Fatal(err)
		}
		if err := heal(); err != nil {
			t.Fatal(err)
		}
		after, err := f.Info(ctx)
		if err != nil || !after.Ready || after.Generation != before.Generation {
			t.Fatalf("after the meta was lost: %+v, %v; before %+v", after, err, before)
		}
		if ok, err := f.Test(ctx, "k999"); err != nil || !ok {
			t.Fatalf("k999: %v, %v", ok, err)
		}
		// The count survives, so a short source is still refused.
		if _, err := f.Rebuild(ctx, seq("k", 10), nil); !errors.Is(err, bloom.ErrShortSource) {
			t.Fatalf("a short rebuild after the heal: %v", err)
		}
	}
}

// TestSaturationCountsDistinctIDs: Adds of IDs the filter holds already
// (every Set re-adds its ID) do not make it look saturated; new IDs past
// its sizing do.
func TestSaturationCountsDistinctIDs(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	var fired []bloom.Saturation
	opts := &bloom.Options{ExpectedItems: 1000, OnSaturated: func(s bloom.Saturation) { fired = append(fired, s) }}
	f, err := bloom.Open(ctx, c, c.Prefix+":bf", opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Rebuild(ctx, seq("k", 900), nil); err != nil {
		t.Fatal(err)
	}
	for range 20 { // 18,000 Adds of 900 IDs
		if err := f.AddMany(ctx, ids("k", 0, 900)); err != nil {
			t.Fatal(err)
		}
	}
	if len(fired) != 0 {
		t.Fatalf("repeated Adds of 900 IDs in a filter for 1,000 fired OnSaturated: %+v", fired)
	}
	g, err := bloom.Open(ctx, c, c.Prefix+":bf", opts) // a client whose last look is not a minute old
	if err != nil {
		t.Fatal(err)
	}
	if err := g.AddMany(ctx, ids("new", 0, 3000)); err != nil {
		t.Fatal(err)
	}
	if len(fired) != 1 || fired[0].EstimatedFPRate < 0.015 {
		t.Fatalf("3,900 distinct IDs in a filter for 1,000: OnSaturated %+v", fired)
	}
}
