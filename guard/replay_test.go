package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestFailedWritesAreReplayed: IDs 60 and 61 are cached; Redis stops with
// SHUTDOWN SAVE; the service updates row 60 and deletes row 61 (committed),
// and its Set and Delete fail. Redis comes back from its dump, holding the
// old entries. The writing process never serves them: it loads those IDs
// through until its writes are replayed, and then every process (a second
// Guard here) reads the new rows. No acknowledged write was lost: the
// restart is not counted as losing any.
func TestFailedWritesAreReplayed(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	d := newDB(100)
	source := func(context.Context) iter.Seq2[string, error] { return ids("p", 100) }
	open := func() *guard.Guard {
		g, err := guard.New(ctx, rdb, "product", &guard.Options{Filter: guard.FilterOptions{ExpectedItems: 1000, IDs: source}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	writer, other := open(), open()
	for _, g := range []*guard.Guard{writer, other} {
		for _, id := range []string{"p60", "p61"} {
			if _, err := guard.Get(ctx, g, id, d.load); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rdb.ShutdownSave(ctx).Err(); err != nil && !errors.Is(err, redis.ErrClosed) {
		t.Logf("shutdown: %v", err)
	}
	updated := product{ID: "p60", Name: "updated", Price: 6060}
	d.set(updated) // the database commits both writes...
	d.del("p61")
	if err := guard.Set(ctx, writer, "p60", updated); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Set with Redis down: %v, want ErrUnavailable", err)
	}
	if err := writer.Delete(ctx, "p61"); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Delete with Redis down: %v, want ErrUnavailable", err)
	}
	if n := writer.Stats().Unwritten; n != 2 {
		t.Fatalf("Unwritten %d, want 2", n)
	}
	if _, err := os.Stat(filepath.Join(srv.Dir, "dump.rdb")); err != nil {
		t.Fatalf("no dump to restart from: %v", err) // the old entries come back from it
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	stale, reads := 0, 0
	check := func() {
		reads++
		if p, err := guard.Get(ctx, writer, "p60", d.load); err == nil && p.Price != updated.Price {
			stale++
		}
		if _, err := guard.Get(ctx, writer, "p61", d.load); err == nil {
			stale++
		}
	}
	eventually(t, 10*time.Second, "the writes replayed", func() bool {
		check()
		return writer.Stats().Unwritten == 0
	})
	for range 50 {
		check()
	}
	if stale > 0 {
		t.Fatalf("%d stale answers in the writing process over %d reads", stale, reads)
	}
	p, err := guard.Get(ctx, other, "p60", d.load)
	if err != nil || p.Price != updated.Price {
		t.Fatalf("another process after the replay: %+v, %v; want the updated row", p, err)
	}
	if _, err := guard.Get(ctx, other, "p61", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("another process after the replay: the deleted row gives %v, want ErrNotFound", err)
	}
	if st := writer.Stats(); st.WritesLost != 0 {
		t.Fatalf("writes lost: %d, want 0: none was acknowledged (%+v)", st.WritesLost, st)
	}
	t.Logf("0 stale answers in the writing process over %d reads of each ID after the restart", reads)
}

// partition fails every pipeline that publishes an invalidation (the writes
// and their replays) or adds to the filter (Add: it reads the filter's meta)
// while on, as a network partition between this process and Redis would;
// reads pass.
type partition struct{ on atomic.Bool }

func (p *partition) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *partition) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *partition) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.on.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "publish" || c.Name() == "hgetall" }) {
			err := errors.New("partitioned: write dropped")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// partitioned opens a Guard on a client of its own, whose writes cut fails
// while on.
func partitioned(t *testing.T, prefix string) (*partition, *guard.Guard) {
	t.Helper()
	cut := &partition{}
	rdb := redistest.NewClient()
	rdb.AddHook(cut)
	t.Cleanup(func() { _ = rdb.Close() })
	return cut, openRebuilt(t, rdb, guard.Options{KeyPrefix: prefix}, 1000, 10)
}

// TestUnwrittenIDsLoadThrough: while an ID's failed write cannot be replayed
// (its pipeline keeps failing) and Redis still holds the entry it meant to
// replace, the writing process answers that ID from the database, never
// from the entry; once the partition heals the replay lands and the other
// processes read the new row too.
func TestUnwrittenIDsLoadThrough(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	cut, writer := partitioned(t, c.Prefix)
	d := newDB(10)
	other := openRebuilt(t, c, guard.Options{KeyPrefix: c.Prefix}, 1000, 10)
	for _, g := range []*guard.Guard{writer, other} {
		if _, err := guard.Get(ctx, g, "p6", d.load); err != nil {
			t.Fatal(err)
		}
	}
	cut.on.Store(true)
	updated := product{ID: "p6", Name: "updated", Price: 606}
	d.set(updated)
	if err := guard.Set(ctx, writer, "p6", updated); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Set across the partition: %v, want ErrUnavailable", err)
	}
	stale := 0
	for range 200 {
		p, err := guard.Get(ctx, writer, "p6", d.load)
		if err != nil {
			t.Fatal(err)
		}
		if p.Price != updated.Price {
			stale++
		}
	}
	if p, _ := guard.Get(ctx, other, "p6", d.load); p.Price == updated.Price {
		t.Fatal("the other process read the new row: the old entry was not there, the test shows nothing")
	}
	if st := writer.Stats(); stale > 0 || st.Unwritten != 1 || st.LoadThroughs != 200 {
		t.Fatalf("%d of 200 answers stale in the writing process; stats %+v", stale, st)
	}
	cut.on.Store(false)
	eventually(t, 10*time.Second, "replayed after the partition healed", func() bool { return writer.Stats().Unwritten == 0 })
	if p, err := guard.Get(ctx, other, "p6", d.load); err != nil || p.Price != updated.Price {
		t.Fatalf("the other process after the replay: %+v, %v; want the updated row", p, err)
	}
	loads := d.calls.Load()
	if p, err := guard.Get(ctx, writer, "p6", d.load); err != nil || p.Price != updated.Price || d.calls.Load() != loads {
		t.Fatalf("the writer after the replay: %+v, %v, %d loads; want the updated row from the cache", p, err, d.calls.Load()-loads)
	}
}

// TestUnwrittenOverflow: more failed writes than the set holds make every
// Get of the Guard load through, until the held IDs are replayed and every
// entry of the Guard is dropped; then Gets read the cache again.
func TestUnwrittenOverflow(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys, no process-wide state: runs beside the others
	ctx := context.Background()
	c := redistest.Connect(t)
	cut, writer := partitioned(t, c.Prefix)
	d := newDB(10)
	if _, err := guard.Get(ctx, writer, "p1", d.load); err != nil { // cached
		t.Fatal(err)
	}
	many := make([]string, guard.MaxUnwritten+1)
	for i := range many {
		many[i] = fmt.Sprintf("gone%d", i)
	}
	cut.on.Store(true)
	if err := writer.Invalidate(ctx, many...); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Invalidate across the partition: %v", err)
	}
	if st := writer.Stats(); st.Unwritten != guard.MaxUnwritten+1 {
		t.Fatalf("Unwritten %d, want the cap and 1 for the overflow", st.Unwritten)
	}
	before := writer.Stats().LoadThroughs
	if _, err := guard.Get(ctx, writer, "p1", d.load); err != nil { // an ID never written: loaded through all the same
		t.Fatal(err)
	}
	if n := writer.Stats().LoadThroughs - before; n != 1 {
		t.Fatalf("a Get during the overflow: %d load-throughs, want 1", n)
	}
	cut.on.Store(false)
	eventually(t, 20*time.Second, "replayed", func() bool { return writer.Stats().Unwritten == 0 })
	if n := c.Exists(ctx, c.Prefix+":product:{p1}").Val(); n != 0 {
		t.Fatal("the Guard's entries were not dropped after the overflow")
	}
	loads := d.calls.Load()
	for range 2 { // a miss that caches, then a hit
		if _, err := guard.Get(ctx, writer, "p1", d.load); err != nil {
			t.Fatal(err)
		}
	}
	if n := d.calls.Load() - loads; n != 1 {
		t.Fatalf("%d loads after the replay, want 1: Gets read the cache again", n)
	}
}

// TestAcknowledgedWriteLostInARestart: a Set that Redis acknowledged is
// lost, as in a failover to a replica that had not received it: Redis is
// SIGKILLed, and restarts from a dump made before the Set. The writing
// process's reads fail while it is down (as they fail while Sentinels
// notice a dead master), which makes it replay its recent writes: it never
// serves the entry the Set replaced, and after the replay neither does any
// other process.
func TestAcknowledgedWriteLostInARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts Redis from a dump: make test")
	}
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	d := newDB(10)
	writer := openRebuilt(t, rdb, guard.Options{}, 1000, 10)
	other := openRebuilt(t, rdb, guard.Options{}, 1000, 10)
	for _, g := range []*guard.Guard{writer, other} {
		if _, err := guard.Get(ctx, g, "p3", d.load); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Save(ctx).Err(); err != nil { // the dump holds the old entry
		t.Fatal(err)
	}
	updated := product{ID: "p3", Name: "updated", Price: 303}
	d.set(updated)
	if err := guard.Set(ctx, writer, "p3", updated); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil { // SIGKILL: the acknowledged Set is not in the dump
		t.Fatal(err)
	}
	stale := 0
	for range 10 { // Redis down: loaded through
		if p, err := guard.Get(ctx, writer, "p3", d.load); err == nil && p.Price != updated.Price {
			stale++
		}
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	hits := writer.Stats().Hits
	// Until the replay has landed and reads hit Redis again (past the
	// breaker's second), and 100 Gets more: none may serve the old entry.
	more := 0
	eventually(t, 10*time.Second, "the replay, then 100 Gets from Redis", func() bool {
		if p, err := guard.Get(ctx, writer, "p3", d.load); err == nil && p.Price != updated.Price {
			stale++
		}
		if st := writer.Stats(); st.Unwritten == 0 && st.Hits > hits {
			more++
		}
		return more >= 100
	})
	if st := writer.Stats(); stale > 0 || st.Unwritten > 0 || st.Hits == hits {
		t.Fatalf("%d answers in the writing process served the entry its acknowledged Set replaced; stats %+v", stale, st)
	}
	if p, err := guard.Get(ctx, other, "p3", d.load); err != nil || p.Price != updated.Price {
		t.Fatalf("another process after the replay: %+v, %v", p, err)
	}
}

// TestReplayLandsBetweenPeekAndGet replays the middleware's race step by
// step: Peek reads what Redis holds for an ID whose write failed (the entry
// a Set meant to replace, or the "not found" marker an Add meant to clear),
// the replay lands, then the handler's Get uses what Peek read. Neither may
// answer the old state. The interleaving is forced: the replay is held by
// the partition until Peek has read, and has landed before the Get.
func TestReplayLandsBetweenPeekAndGet(t *testing.T) {
	ctx := context.Background()
	for _, write := range []string{"set", "add"} {
		t.Run(write, func(t *testing.T) {
			c := redistest.Connect(t)
			cut, g := partitioned(t, c.Prefix)
			d := newDB(10)
			id, want := "p6", product{ID: "p6", Name: "updated", Price: 606}
			if write == "add" {
				id, want = "p99", product{ID: "p99", Name: "created", Price: 99}
				if err := g.Add(ctx, id); err != nil { // in the filter, not in the database: a marker
					t.Fatal(err)
				}
			}
			if _, err := guard.Get(ctx, g, id, d.load); (write == "add") != errors.Is(err, guard.ErrNotFound) {
				t.Fatalf("%s before the write: %v", id, err)
			}
			cut.on.Store(true)
			d.set(want)
			err := guard.Set(ctx, g, id, want)
			if write == "add" {
				err = g.Add(ctx, id)
			}
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("%s across the partition: %v, want ErrUnavailable", write, err)
			}
			peeked, exists, err := g.Peek(ctx, id)
			if err != nil || !exists {
				t.Fatalf("Peek of %s with its write unwritten: %v, %v; want it to exist", id, exists, err)
			}
			cut.on.Store(false)
			eventually(t, 10*time.Second, "the write replayed", func() bool { return g.Stats().Unwritten == 0 })
			if p, err := guard.Get(peeked, g, id, d.load); err != nil || p != want {
				t.Fatalf("the Get after Peek answered %+v, %v; want %+v", p, err, want)
			}
		})
	}
}

// TestUnwrittenAddIsNotRejected: an ID whose Add failed is not in the
// filter yet; until the Add is replayed, no entry point answers "not found"
// for it (MayExist, the middleware's check before the first Get, included).
func TestUnwrittenAddIsNotRejected(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	cut, g := partitioned(t, c.Prefix)
	d := newDB(10)
	created := product{ID: "p77", Name: "created", Price: 77}
	if ok, err := g.MayExist(ctx, created.ID); err != nil || ok {
		t.Fatalf("control: MayExist before the Add: %v, %v; want false", ok, err)
	}
	cut.on.Store(true)
	d.set(created)
	if err := g.Add(ctx, created.ID); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Add across the partition: %v, want ErrUnavailable", err)
	}
	if ok, err := g.MayExist(ctx, created.ID); err != nil || !ok {
		t.Fatalf("MayExist with the Add unwritten: %v, %v; want true", ok, err)
	}
	for name, read := range entryPoints {
		if p, err := read(ctx, g, d, created.ID); err != nil || p != created {
			t.Fatalf("%s with the Add unwritten: %+v, %v; want %+v", name, p, err, created)
		}
	}
}
