package bloom_test

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func seq(prefix string, n int) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for i := range n {
			if !yield(prefix+strconv.Itoa(i), nil) {
				return
			}
		}
	}
}

// openFilter opens a filter named bf on a connection of its own.
func openFilter(t *testing.T, opts *bloom.Options) (*redistest.Conn, *bloom.Filter) {
	t.Helper()
	c := redistest.Connect(t)
	f, err := bloom.Open(context.Background(), c, c.Prefix+":bf", opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

func ids(prefix string, from, to int) []string {
	out := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, prefix+strconv.Itoa(i))
	}
	return out
}

func TestSize(t *testing.T) {
	m, k := bloom.Size(1_000_000, 0.01)
	if m != 9_585_059 || k != 7 {
		t.Fatalf("Size(1e6, 1%%) = %d bits, %d hashes; want 9585059, 7", m, k)
	}
}

// measureFP rebuilds a filter of n items at 1% and measures its false-
// positive rate over n absent items. Every present item must test positive.
func measureFP(t *testing.T, opts *bloom.Options) (rate float64, f *bloom.Filter) {
	ctx := context.Background()
	_, f = openFilter(t, opts)
	n := int(opts.ExpectedItems)
	if _, err := f.Rebuild(ctx, seq("id-", n), nil); err != nil {
		t.Fatal(err)
	}
	const batch = 5000
	for from := 0; from < n; from += batch {
		got, err := f.TestMany(ctx, ids("id-", from, min(from+batch, n)))
		if err != nil {
			t.Fatal(err)
		}
		for i, ok := range got {
			if !ok {
				t.Fatalf("false negative for id-%d", from+i)
			}
		}
	}
	fp := 0
	for from := 0; from < n; from += batch {
		got, err := f.TestMany(ctx, ids("absent-", from, min(from+batch, n)))
		if err != nil {
			t.Fatal(err)
		}
		for _, ok := range got {
			if ok {
				fp++
			}
		}
	}
	return float64(fp) / float64(n), f
}

func TestFalsePositiveRate(t *testing.T) {
	rate, f := measureFP(t, &bloom.Options{ExpectedItems: 100_000, FalsePositiveRate: 0.01})
	t.Logf("n=100000 p=1%%: measured %.3f%% (config %+v)", rate*100, f.Config())
	if rate < 0.005 || rate > 0.015 {
		t.Fatalf("false-positive rate %.3f%% outside [0.5%%, 1.5%%]", rate*100)
	}
}

func TestShardedFalsePositiveRate(t *testing.T) {
	rate, f := measureFP(t, &bloom.Options{ExpectedItems: 100_000, FalsePositiveRate: 0.01, MaxShardBytes: 16 << 10})
	cfg := f.Config()
	t.Logf("sharded: %d shards, measured %.3f%%", cfg.Shards, rate*100)
	if cfg.Shards < 4 {
		t.Fatalf("want >= 4 shards, got %+v", cfg)
	}
	if rate < 0.005 || rate > 0.015 {
		t.Fatalf("false-positive rate %.3f%% outside [0.5%%, 1.5%%]", rate*100)
	}
}

func TestOneCommandPerCall(t *testing.T) {
	ctx := context.Background()
	c, f := openFilter(t, &bloom.Options{ExpectedItems: 10_000, MaxShardBytes: 1 << 10})
	if f.Config().Shards < 2 {
		t.Fatalf("want several shards: %+v", f.Config())
	}
	if _, err := f.Rebuild(ctx, seq("", 0), nil); err != nil {
		t.Fatal(err)
	}
	c.Counter.Reset()
	if err := f.Add(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	// Add: one round trip that reads the meta, counts the item into it (a
	// script: only if the meta exists) and sets the bits with one script on
	// the one shard the item lives in.
	if names := c.Counter.Names(); c.Counter.RoundTrips() != 1 || c.Counter.Commands() != 3 || names["eval"] != 2 || names["hgetall"] != 1 {
		t.Fatalf("Add sent %v in %d round trips", names, c.Counter.RoundTrips())
	}
	c.Counter.Reset()
	if ok, err := f.Test(ctx, "x"); err != nil || !ok {
		t.Fatalf("Test(x) = %v, %v", ok, err)
	}
	if names := c.Counter.Names(); c.Counter.Commands() != 1 || names["getrange"] != 1 {
		t.Fatalf("Test sent %v, want one GETRANGE", names)
	}
}

// TestAddManyLargeBatch: one AddMany of 20,000 IDs into a single shard (far
// more offsets than one Lua unpack() can take).
func TestAddManyLargeBatch(t *testing.T) {
	ctx := context.Background()
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 100_000})
	if _, err := f.Rebuild(ctx, seq("", 0), nil); err != nil {
		t.Fatal(err)
	}
	batch := ids("big-", 0, 20_000)
	if err := f.AddMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	got, err := f.TestMany(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range got {
		if !ok {
			t.Fatalf("%s missing after AddMany", batch[i])
		}
	}
}

func TestNotReadyUntilRebuiltAndAfterLoss(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	key := c.Prefix + ":bf"
	f, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Test(ctx, "a"); !errors.Is(err, bloom.ErrNotReady) {
		t.Fatalf("fresh filter: err = %v, want ErrNotReady", err)
	}
	if err := f.Add(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.TestMany(ctx, []string{"a", "b"}); !errors.Is(err, bloom.ErrNotReady) {
		t.Fatalf("Add alone must not make a filter ready: %v", err)
	}
	if _, err := f.Rebuild(ctx, seq("k", 10), nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.Test(ctx, "k3"); err != nil || !ok {
		t.Fatalf("after rebuild Test(k3) = %v, %v", ok, err)
	}
	if ok, err := f.Test(ctx, "absent"); err != nil || ok {
		t.Fatalf("after rebuild Test(absent) = %v, %v", ok, err)
	}
	// Redis loses the bitmap (eviction, FLUSHDB): never a wrong "absent".
	in, err := f.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, keyspace.ForFilter(key).Shard(in.Generation, 0)).Err(); err != nil { // the rebuild's generation
		t.Fatal(err)
	}
	if _, err := f.Test(ctx, "k3"); !errors.Is(err, bloom.ErrNotReady) {
		t.Fatalf("lost bitmap: err = %v, want ErrNotReady", err)
	}
}

func TestMismatchAndInvalid(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	key := c.Prefix + ":bf"
	if _, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 1000}); err != nil {
		t.Fatalf("same sizing must reopen: %v", err)
	}
	if _, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 2000, Strict: true}); !errors.Is(err, bloom.ErrMismatch) {
		t.Fatalf("other sizing, strict: err = %v, want ErrMismatch", err)
	}
	// By default another sizing adopts the stored layout.
	f, err := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 2000})
	if err != nil || !f.Adopted() || f.Config().ExpectedItems != 1000 {
		t.Fatalf("other sizing: %v, adopted %v, config %+v", err, f != nil && f.Adopted(), f)
	}
	if same, _ := bloom.Open(ctx, c, key, &bloom.Options{ExpectedItems: 1000}); same.Adopted() {
		t.Fatal("same sizing reported as adopted")
	}
	for _, o := range []*bloom.Options{{FalsePositiveRate: 1.5}, {FalsePositiveRate: -1}, {MaxShardBytes: 1 << 40}} {
		if _, err := bloom.Open(ctx, c, key+"x", o); !errors.Is(err, bloom.ErrInvalid) {
			t.Fatalf("%+v: err = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := bloom.Open(ctx, c, "a{b}", nil); !errors.Is(err, bloom.ErrInvalid) {
		t.Fatalf("braced key: err = %v, want ErrInvalid", err)
	}
}

func TestRebuildSourceError(t *testing.T) {
	ctx := context.Background()
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 1000})
	boom := errors.New("db gone")
	src := func(yield func(string, error) bool) {
		if yield("a", nil) {
			yield("", boom)
		}
	}
	if _, err := f.Rebuild(ctx, src, nil); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want source error", err)
	}
	if _, err := f.Test(ctx, "a"); !errors.Is(err, bloom.ErrNotReady) {
		t.Fatalf("a failed rebuild must not make the filter ready: %v", err)
	}
}

// TestRebuildStopsItsWorkers: a source that fails, and a context cancelled,
// after some batches went to the hashing workers, end Rebuild with that
// error and the filter not made ready, and Rebuild returns only once its
// workers stopped: the worker whose count of IDs hashed passes 100,000 is
// held in Progress, and Rebuild must not have returned when the hold ends
// (300 ms, or Rebuild's return).
func TestRebuildStopsItsWorkers(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{{"source error", errors.New("db gone")}, {"cancelled", context.Canceled}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, f := openFilter(t, &bloom.Options{ExpectedItems: 1_000_000})
			returned, released := make(chan struct{}), make(chan struct{})
			var held, early atomic.Bool // early: Rebuild returned while a worker was held
			hold := func(p bloom.RebuildProgress) {
				if !held.CompareAndSwap(false, true) {
					return
				}
				defer close(released)
				select {
				case <-returned:
					early.Store(true)
				case <-time.After(300 * time.Millisecond):
				}
			}
			src := func(yield func(string, error) bool) {
				for i := 0; ; i++ {
					if i == 101_000 { // the batch with the 100,000th ID went to a worker
						if tc.want != context.Canceled {
							yield("", tc.want)
							return
						}
						cancel()
					}
					if !yield(strconv.Itoa(i), nil) {
						return
					}
				}
			}
			_, err := f.Rebuild(ctx, src, &bloom.RebuildOptions{Progress: hold})
			close(returned)
			if !held.Load() {
				t.Fatal("no worker hashed the 100,000th ID: nothing was held")
			}
			<-released
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if early.Load() {
				t.Fatal("Rebuild returned while one of its workers was still running")
			}
			if _, err := f.Test(context.Background(), "1"); !errors.Is(err, bloom.ErrNotReady) {
				t.Fatalf("a failed rebuild must not make the filter ready: %v", err)
			}
		})
	}
}

// TestRebuildProgressPanics: a panic in Progress, which a hashing worker
// calls, panics out of Rebuild, where its caller can recover it.
func TestRebuildProgressPanics(t *testing.T) {
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 1_000_000})
	defer func() {
		if p := recover(); p != "progress bug" {
			t.Fatalf("recovered %v, want the panic of Progress", p)
		}
	}()
	boom := func(p bloom.RebuildProgress) {
		if p.BytesTotal == 0 { // a worker's call
			panic("progress bug")
		}
	}
	_, err := f.Rebuild(context.Background(), seq("k", 200_000), &bloom.RebuildOptions{Progress: boom})
	t.Fatalf("Rebuild returned %v", err)
}

// TestRebuildSourcePanics: a source that panics after some batches went to
// the workers panics out of Rebuild, and no worker is left running (the
// code before closed their channel only on a return).
func TestRebuildSourcePanics(t *testing.T) {
	ctx := context.Background()
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 1_000_000})
	src := func(yield func(string, error) bool) {
		for i := 0; ; i++ {
			if i == 20_000 {
				panic("source broke")
			}
			if !yield(strconv.Itoa(i), nil) {
				return
			}
		}
	}
	func() {
		defer func() {
			if p := recover(); p != "source broke" {
				t.Fatalf("recovered %v, want the source's panic", p)
			}
		}()
		_, _ = f.Rebuild(ctx, src, nil)
	}()
	stacks := make([]byte, 1<<20)
	stacks = stacks[:runtime.Stack(stacks, true)]
	if bytes.Contains(stacks, []byte("bloom.(*rebuild).build.func")) {
		t.Fatalf("Rebuild panicked with its workers running:\n%s", stacks)
	}
}

// TestRebuildRefusesASaturatedFilter: a rebuild that read far more IDs than
// its sizing holds fails with ErrTooSmall and leaves the current generation
// answering; sized for them, it goes through.
func TestRebuildRefusesASaturatedFilter(t *testing.T) {
	ctx := context.Background()
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 1000})
	if _, err := f.Rebuild(ctx, seq("old-", 1000), nil); err != nil {
		t.Fatal(err)
	}
	before, err := f.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.Rebuild(ctx, seq("new-", 20_000), nil); !errors.Is(err, bloom.ErrTooSmall) || n != 20_000 {
		t.Fatalf("20,000 IDs into a filter for 1,000: %d, %v; want ErrTooSmall", n, err)
	}
	after, err := f.Info(ctx)
	if err != nil || after.Generation != before.Generation || !after.Ready {
		t.Fatalf("the refused rebuild changed the filter: before %+v, after %+v (%v)", before, after, err)
	}
	if ok, err := f.Test(ctx, "old-7"); err != nil || !ok {
		t.Fatalf("an ID of the current generation after the refused rebuild: %v, %v", ok, err)
	}
	if _, err := f.Rebuild(ctx, seq("new-", 20_000), &bloom.RebuildOptions{ExpectedItems: 20_000}); err != nil {
		t.Fatalf("sized for the IDs: %v", err)
	}
	if ok, err := f.Test(ctx, "new-19999"); err != nil || !ok {
		t.Fatalf("an ID of the resized generation: %v, %v", ok, err)
	}
}

// TestRedisDownIsErrUnavailable: every operation that needs Redis reports a
// dead server with an error wrapping ErrUnavailable, never ErrNotReady (which
// means "the filter cannot answer", not "Redis cannot").
func TestRedisDownIsErrUnavailable(t *testing.T) {
	t.Parallel() // its own server: runs beside the other slow one
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	f, err := bloom.Open(ctx, rdb, "bf", &bloom.Options{ExpectedItems: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Rebuild(ctx, seq("k", 10), nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	ops := map[string]func() error{
		"Open":     func() error { _, err := bloom.Open(ctx, rdb, "bf2", nil); return err },
		"Test":     func() error { _, err := f.Test(ctx, "k1"); return err },
		"TestMany": func() error { _, err := f.TestMany(ctx, []string{"k1", "k2"}); return err },
		"Add":      func() error { return f.Add(ctx, "k11") },
		"AddMany":  func() error { return f.AddMany(ctx, []string{"k11", "k12"}) },
		"Rebuild":  func() error { _, err := f.Rebuild(ctx, seq("k", 10), nil); return err },
		"Info":     func() error { _, err := f.Info(ctx); return err },
		"Queue": func() error {
			pipe := rdb.Pipeline()
			p := f.Queue(ctx, pipe, "k1")
			_, _ = pipe.Exec(ctx)
			_, err := p.Result(ctx)
			return err
		},
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, bloom.ErrUnavailable) || errors.Is(err, bloom.ErrNotReady) {
			t.Errorf("%s with Redis down: %v, want ErrUnavailable", name, err)
		}
	}
}

// eventually waits until cond holds, failing after within with what: for
// state that sends no word of its change (a reader's next reload of the
// meta, a count of probes). See redistest.Eventually.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	redistest.Eventually(t, within, what, cond)
}

// TestLostShardReadsTheMetaSparingly: a shard Redis lost while the meta
// still names its generation (evicted) is not ready, and each probe of it
// no longer re-reads the meta: one read confirms the loss, and the next
// waits goneEvery (10 ms). Control: the same probes of a generation
// another client switched away from re-read it and answer.
func TestLostShardReadsTheMetaSparingly(t *testing.T) {
	ctx := context.Background()
	c, f := openFilter(t, &bloom.Options{ExpectedItems: 1000})
	if _, err := f.Rebuild(ctx, seq("k", 10), nil); err != nil {
		t.Fatal(err)
	}
	in, err := f.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, keyspace.ForFilter(c.Prefix+":bf").Shard(in.Generation, 0)).Err(); err != nil {
		t.Fatal(err)
	}
	c.Counter.Reset()
	start := time.Now()
	for range 200 {
		if _, err := f.Test(ctx, "k3"); !errors.Is(err, bloom.ErrNotReady) {
			t.Fatalf("lost shard: err = %v, want ErrNotReady", err)
		}
	}
	most := 2 + int(time.Since(start)/(10*time.Millisecond))
	if got := c.Counter.Names()["hgetall"]; got < 1 || got > most {
		t.Fatalf("200 probes of a lost shard read the meta %d times in %v, want 1 to %d", got, time.Since(start), most)
	}
	// Control: another client rebuilds (drops that generation, switches to the next):
	// once the loss is 10 ms old, the next probe re-reads the meta and
	// answers from the next.
	other, err := bloom.Open(ctx, redistest.Connect(t), c.Prefix+":bf", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Rebuild(ctx, seq("k", 10), nil); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, time.Second, "a probe follows the switch", func() bool {
		_, err := f.Test(ctx, "k3")
		return err == nil
	})
	for range 20 {
		if ok, err := f.Test(ctx, "k3"); err != nil || !ok {
			t.Fatalf("after another client's switch: Test(k3) = %v, %v", ok, err)
		}
	}
}
