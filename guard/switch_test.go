package guard_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// switchCounts is how a's reads at another Guard's switch were answered.
type switchCounts struct {
	unconfirmed  int   // ErrUnconfirmed (503): must be 0
	falseMissing int   // an ID the filter holds answered ErrNotFound: must be 0
	unknownLoads int64 // loads of IDs that exist nowhere: 0 (a false positive is 1% of them)
	other        []error
}

func (c *switchCounts) String() string {
	return fmt.Sprintf("%d ErrUnconfirmed, %d false ErrNotFound, %d unknown IDs loaded, other errors %v",
		c.unconfirmed, c.falseMissing, c.unknownLoads, c.other)
}

// switchSha is the SHA1 of bloom's switch_gen.lua, the script that makes
// the next generation current (its EVALSHA is what the window hook holds).
func switchSha(t *testing.T) string {
	src, err := os.ReadFile("../bloom/lua/switch_gen.lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return hex.EncodeToString(sum[:])
}

// TestSwitchInAnotherGuard: Guard b, on a client of its own (another
// process, as far as Redis can tell), rebuilds the filter while Guard a
// reads. A rebuild drops the old generation's shards, then switches the
// meta: a's probes find their blocks gone. Each case forces one
// interleaving, and a's Gets, GetMany and Peek must answer as from a ready
// filter: no ErrUnconfirmed (a's copy of the filter is of the old
// generation, so it does not know new*, the IDs b's rebuild read), no false
// ErrNotFound, unknown IDs rejected.
//   - window: a's reads land after b dropped the shards and before its
//     switch (b's switch is held). The meta still names the old generation
//     and announces the new one.
//   - crowd: many of a's reads find the old generation gone at once; the
//     first one's re-read of the meta is held until the others found it too.
//   - process: crowd, the rebuild made by another process (childSwitch).
//   - auto: crowd, the switch made by b's automatic rebuild after Redis
//     lost the filter (a probes its generation, gone; b's is new).
//
// Before this was fixed (a re-read at most every 100 ms, by one caller, the
// others answering ErrNotReady; and none between drop and switch) both
// failed: 15 of 16 concurrent Gets answered 503 at a switch.
func TestSwitchInAnotherGuard(t *testing.T) {
	clusterToo(t)
	for _, tc := range []string{"window", "crowd", "process", "auto"} {
		t.Run(tc, func(t *testing.T) {
			n := switchCase(t, tc)
			t.Logf("%s: %v", tc, n)
			if n.unconfirmed != 0 || n.falseMissing != 0 || n.unknownLoads > 1 || len(n.other) != 0 {
				t.Errorf("at another Guard's switch: %v", n)
			}
		})
	}
}

func switchCase(t *testing.T, how string) *switchCounts {
	ctx := context.Background()
	ca, cb := redistest.Connect(t), redistest.Connect(t)
	ha, hb := hooked(ca), hooked(cb)
	open := func(c *redistest.Conn) *guard.Guard {
		o := &guard.Options{KeyPrefix: ca.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}}
		if how == "auto" && c == cb {
			o.Filter.IDs = func(context.Context) iter.Seq2[string, error] { return switchSource }
		}
		g, err := guard.New(ctx, c, "sw-"+how, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	a := open(ca)
	for range 2 { // two generations, so that a's is not the first
		if _, err := a.Rebuild(ctx, ids("p", 100), nil); err != nil {
			t.Fatal(err)
		}
	}
	// b opens on a built filter: in the auto case its automatic rebuild
	// waits for the loss (opened before, it raced a's rebuilds from its
	// own source).
	b := open(cb)
	if err := guard.RefreshCopy(ctx, a); err != nil {
		t.Fatal(err)
	}
	meta := keyspace.ForFilter(ca.Prefix + ":sw-" + how + ":bf").Meta()

	var n switchCounts
	var mu sync.Mutex
	count := func(id string, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
		case errors.Is(err, guard.ErrUnconfirmed):
			n.unconfirmed++
		case errors.Is(err, guard.ErrNotFound) && id[0] != 'x':
			n.falseMissing++
		case !errors.Is(err, guard.ErrNotFound):
			n.other = append(n.other, err)
		}
	}
	load := func(_ context.Context, id string) (product, error) {
		if id[0] == 'x' {
			atomic.AddInt64(&n.unknownLoads, 1)
			return product{}, guard.ErrNotFound
		}
		return product{ID: id}, nil
	}
	loadMany := func(ctx context.Context, ids []string) (map[string]product, error) {
		out := map[string]product{}
		for _, id := range ids {
			if p, err := load(ctx, id); err == nil {
				out[id] = p
			}
		}
		return out, nil
	}
	// reads is a's traffic at the switch: Gets of unknown IDs and of IDs
	// only b's rebuild read, a GetMany of both, Peeks; crowd Gets, gated,
	// start together.
	var calls atomic.Int32 // a's calls that returned
	reads := func(gate <-chan struct{}, peek bool) *sync.WaitGroup {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				defer calls.Add(1)
				<-gate
				id := fmt.Sprintf("x%d", i)
				if i%4 == 0 {
					id = fmt.Sprintf("new%d", i)
				}
				_, err := guard.Get(ctx, a, id, load)
				count(id, err)
			})
		}
		wg.Go(func() {
			defer calls.Add(1)
			<-gate
			many := []string{"x100", "x101", "new100", "x102", "new101"}
			got, err := guard.GetMany(ctx, a, many, loadMany)
			count("many", err)
			if err == nil && len(got) != 2 {
				count("new100", fmt.Errorf("%w: GetMany found %d of 2", guard.ErrNotFound, len(got)))
			}
		})
		if !peek { // Peek waits 100 ms at most: not behind a held read
			return &wg
		}
		wg.Go(func() {
			defer calls.Add(1)
			<-gate
			for _, id := range []string{"new200", "x200"} {
				_, may, err := a.Peek(ctx, id)
				if err == nil && !may && id[0] == 'n' {
					err = fmt.Errorf("%w: Peek said absent", guard.ErrNotFound)
				}
				count(id, err)
			}
		})
		return &wg
	}
	switch how {
	case "window":
		// b's switch waits until a's reads are done.
		sha := switchSha(t)
		held := make(chan struct{})
		release := make(chan struct{})
		var once sync.Once
		hold := func(cmd redis.Cmder) {
			if a := cmd.Args(); len(a) > 3 && a[0] == "evalsha" && a[1] == sha {
				once.Do(func() { close(held) })
				<-release
			}
		}
		hb.sending.Store(&hold)
		done := make(chan error, 1)
		go func() {
			_, err := b.Rebuild(ctx, switchSource, nil)
			done <- err
		}()
		<-held
		open := make(chan struct{})
		close(open)
		reads(open, true).Wait()
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// a still probes the old generation: its next read moves on.
		_, err := guard.Get(ctx, a, "p1", load)
		count("p1", err)
	case "crowd", "process", "auto":
		switch how {
		case "crowd":
			if _, err := b.Rebuild(ctx, switchSource, nil); err != nil {
				t.Fatal(err)
			}
		case "process":
			redistest.Spawn(t, "switch", "PREFIX="+ca.Prefix, "NAME=sw-"+how).Wait(t, false)
		case "auto": // Redis loses the filter; b's next probe rebuilds it from Filter.IDs
			if err := ca.DropOwn(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := b.MayExist(ctx, "p1"); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "b's automatic rebuild", func() bool {
				in, err := b.Info(ctx)
				return err == nil && in.Ready && !guard.AutoRebuilding(b)
			})
		}
		// a's first re-read of the meta waits until every other read has
		// either answered or waits for it.
		reached := make(chan struct{})
		release := make(chan struct{})
		var once sync.Once
		hold := func(cmd redis.Cmder) {
			if a := cmd.Args(); len(a) == 2 && a[0] == "hgetall" && a[1] == meta {
				once.Do(func() {
					close(reached)
					<-release
				})
			}
		}
		ha.sending.Store(&hold)
		gate := make(chan struct{})
		wg := reads(gate, false)
		self := redistest.GoID()
		close(gate)
		<-reached
		// 17 callers: 16 Gets and a GetMany. One holds the read.
		eventually(t, 20*time.Second, "the others answered or wait for the meta", func() bool {
			return int(calls.Load())+redistest.Parked(self, "bloom.(*Filter).metaSince", "") >= 16
		})
		close(release)
		wg.Wait()
	}
	// The copy follows the switch: it is of b's generation within its
	// refresh period, at once here: a's probes adopt the new generation
	// (MayExist probes; in the window, a probe within 10 ms of a's read of
	// the switching meta answers from the announced generation without
	// adopting it), and that wakes the copy.
	in, err := a.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a's copy is of the new generation", func() bool {
		_, err := a.MayExist(ctx, "p1")
		return err == nil && guard.CopyGeneration(a) == in.Generation
	})
	return &n
}

// switchSource is the rebuild of the switch: p0..p99, and new0..new299,
// rows that a's copy of the filter has never seen.
func switchSource(yield func(string, error) bool) {
	for id, err := range ids("p", 100) {
		if !yield(id, err) {
			return
		}
	}
	for i := range 300 {
		if !yield(fmt.Sprintf("new%d", i), nil) {
			return
		}
	}
}

// childSwitch rebuilds the filter of Guard NAME under PREFIX from
// switchSource: another process's switch.
func childSwitch(rdb redis.UniversalClient) int {
	ctx := context.Background()
	g, err := guard.New(ctx, rdb, os.Getenv("NAME"), &guard.Options{KeyPrefix: os.Getenv("PREFIX"),
		Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, switchSource, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
