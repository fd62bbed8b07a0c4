package bloom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestHealsFromLostKeys: no sequence of Redis losing the filter's keys
// leaves it in a state that Rebuild or a new Open cannot get out of, and
// none makes it answer a wrong "absent".
func TestHealsFromLostKeys(t *testing.T) {
	ctx := context.Background()
	opts := &bloom.Options{ExpectedItems: 10_000}
	lose := map[string]func(c *redistest.Conn, key string, f *bloom.Filter) error{
		// FLUSHALL, then an Add before anything else: AddMany's counter
		// increment used to recreate the meta with only "added".
		"flush then Add": func(c *redistest.Conn, key string, f *bloom.Filter) error {
			if err := c.FlushMasters(ctx); err != nil {
				return err
			}
			return f.Add(ctx, "k1")
		},
		"meta evicted then Add": func(c *redistest.Conn, key string, f *bloom.Filter) error {
			if err := c.Del(ctx, keyspace.ForFilter(key).Meta()).Err(); err != nil {
				return err
			}
			return f.AddMany(ctx, []string{"k1", "k2"})
		},
		"partial meta": func(c *redistest.Conn, key string, f *bloom.Filter) error {
			meta := keyspace.ForFilter(key).Meta()
			if err := c.Del(ctx, meta).Err(); err != nil {
				return err
			}
			return c.HSet(ctx, meta, "added", 5).Err()
		},
		"shards lost": func(c *redistest.Conn, key string, f *bloom.Filter) error {
			in, err := f.Info(ctx)
			if err != nil {
				return err
			}
			for i := range in.Config.Shards {
				if err := c.Del(ctx, keyspace.ForFilter(key).Shard(in.Generation, i)).Err(); err != nil {
					return err
				}
			}
			return f.Add(ctx, "k1")
		},
		"flush mid-Rebuild": func(c *redistest.Conn, key string, f *bloom.Filter) error {
			flushed := false
			_, err := f.Rebuild(ctx, seq("k", 200_000), &bloom.RebuildOptions{Progress: func(bloom.RebuildProgress) {
				if !flushed {
					flushed = true
					_ = c.FlushMasters(ctx)
				}
			}})
			if err == nil {
				return errors.New("a rebuild whose meta vanished reported success")
			}
			return nil
		},
	}
	for name, fn := range lose {
		t.Run(name, func(t *testing.T) {
			c := redistest.Connect(t)
			key := c.Prefix + ":bf"
			f, err := bloom.Open(ctx, c, key, opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Rebuild(ctx, seq("k", 100), nil); err != nil {
				t.Fatal(err)
			}
			if err := fn(c, key, f); err != nil {
				t.Fatal(err)
			}
			// Never a wrong "absent" in between.
			if ok, err := f.Test(ctx, "k3"); err == nil && !ok {
				t.Fatal("a lost filter answered absent for an added ID")
			}
			// A new process can open it, and one Rebuild heals it.
			g, err := bloom.Open(ctx, c, key, opts)
			if err != nil {
				t.Fatalf("Open after the loss: %v", err)
			}
			if _, err := g.Rebuild(ctx, seq("k", 100), nil); err != nil {
				t.Fatalf("Rebuild after the loss: %v", err)
			}
			// The old client follows the new generation at its next probe
			// (a missing block: one meta read, then the new generation).
			for _, fl := range []*bloom.Filter{f, g} {
				eventually(t, 2*time.Second, "Test(k3) after the heal", func() bool {
					ok, err := fl.Test(ctx, "k3")
					if err == nil && !ok {
						t.Fatal("after the heal Test(k3) = false")
					}
					return err == nil
				})
				if ok, err := fl.Test(ctx, "absent"); err != nil || ok {
					t.Fatalf("after the heal Test(absent) = %v, %v", ok, err)
				}
			}
		})
	}
}

// TestGenerationsOutliveALostFilter: a client holds the layout of
// generation 2 (sized for 1,000 IDs) when Redis loses the filter (an empty
// restart); another client, sized otherwise, opens it anew and rebuilds
// it. The first client's probes must never read the new filter's bits
// with its old layout: each generation number is new, so its old shards are
// missing and it follows the meta. Chaos seed 2 found a restarted service
// answering "not found" for existing IDs after an empty restart, when
// generations restarted from 1 and a new generation 2 had another sizing
// (control: with generations from 1, most of the 1,000 IDs test absent).
func TestGenerationsOutliveALostFilter(t *testing.T) {
	ctx := context.Background()
	c, a := openFilter(t, &bloom.Options{ExpectedItems: 1000})
	if _, err := a.Rebuild(ctx, seq("k", 1000), nil); err != nil {
		t.Fatal(err)
	}
	before, err := a.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DropOwn(ctx); err != nil { // Redis lost every key of the filter
		t.Fatal(err)
	}
	b, err := bloom.Open(ctx, redistest.Connect(t), c.Prefix+":bf", &bloom.Options{ExpectedItems: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := b.Rebuild(ctx, seq("k", 1000), nil); err != nil {
			t.Fatal(err)
		}
		in, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.Generation >= before.Generation {
			if in.Generation == before.Generation && in.Config == before.Config {
				t.Fatalf("generation %d came back with the same sizing: the test shows nothing", in.Generation)
			}
			break
		}
	}
	absent := 0
	for _, id := range ids("k", 0, 1000) {
		if ok, err := a.Test(ctx, id); err == nil && !ok {
			absent++
		}
	}
	if absent != 0 {
		t.Fatalf("%d of 1,000 IDs of the rebuilt filter test absent through the layout held from before the loss", absent)
	}
}
