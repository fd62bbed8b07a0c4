package guard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// twoGuards opens a Guard called "product" in two "processes" (two clients,
// two Guards) on one prefix, with the filter rebuilt from the first n rows of
// a fresh db.
func twoGuards(t *testing.T, n int, opts *guard.Options) (c1 *redistest.Conn, g1, g2 *guard.Guard, d *db) {
	t.Helper()
	c1, g1, d = setup(t, n, opts)
	c2 := redistest.Connect(t)
	var o guard.Options
	if opts != nil {
		o = *opts
	}
	o.KeyPrefix, o.Filter.ExpectedItems = c1.Prefix, 10_000
	g2, err := guard.New(context.Background(), c2, "product", &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g2.Close() })
	return c1, g1, g2, d
}

// TestCreatedIDsAreServedAtOnce: IDs asked for before they existed (cached
// as markers: bloom false positives of a full filter, every ID while the
// filter is lost) and IDs deleted then re-created are served by another
// process right after the create and its Add.
func TestCreatedIDsAreServedAtOnce(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	for _, filter := range []string{"full", "lost"} {
		t.Run(filter, func(t *testing.T) {
			t.Parallel() // each its own keys: the two run side by side
			ctx := context.Background()
			var opts *guard.Options
			if filter == "lost" { // markers while the filter is lost: no copy of it judges the IDs (TestCopyThroughIncidents does)
				opts = &guard.Options{Filter: guard.FilterOptions{NoLocalCopy: true}}
			}
			c, g1, g2, d := twoGuards(t, 10_000, opts) // 10,000 rows: the filter at its sized capacity
			if filter == "lost" {
				if err := c.DropOwn(ctx); err != nil { // Redis lost everything (of this test's): fail open
					t.Fatal(err)
				}
			}
			const fresh, recreated = 3000, 500
			for i := range fresh {
				if _, err := guard.Get(ctx, g2, fmt.Sprintf("new%d", i), d.load); !errors.Is(err, guard.ErrNotFound) {
					t.Fatalf("new%d before its create: %v", i, err)
				}
			}
			markers := g2.Stats().Loads
			staleNew := 0
			for i := range fresh {
				id := fmt.Sprintf("new%d", i)
				d.set(product{ID: id, Price: i})
				if err := g1.Add(ctx, id); err != nil {
					t.Fatal(err)
				}
				if p, err := guard.Get(ctx, g2, id, d.load); err != nil || p.Price != i {
					staleNew++
				}
			}
			staleRecreated := 0
			for i := range recreated {
				id := fmt.Sprintf("re%d", i)
				d.set(product{ID: id, Price: 1})
				if err := g1.Add(ctx, id); err != nil {
					t.Fatal(err)
				}
				if _, err := guard.Get(ctx, g2, id, d.load); err != nil {
					t.Fatal(err)
				}
				d.del(id)
				if err := g1.Delete(ctx, id); err != nil {
					t.Fatal(err)
				}
				if _, err := guard.Get(ctx, g2, id, d.load); !errors.Is(err, guard.ErrNotFound) {
					t.Fatalf("%s after its delete: %v", id, err)
				}
				d.set(product{ID: id, Price: 2})
				if err := g1.Add(ctx, id); err != nil {
					t.Fatal(err)
				}
				if p, err := guard.Get(ctx, g2, id, d.load); err != nil || p.Price != 2 {
					staleRecreated++
				}
			}
			t.Logf(
				"filter %s: %d new IDs asked for before creation (%d cached as markers): %d not served after create + Add; %d deleted and re-created: %d not served",
				filter,
				fresh,
				markers,
				staleNew,
				recreated,
				staleRecreated,
			)
			if markers == 0 {
				t.Fatal("no marker was cached: the test exercised nothing")
			}
			if staleNew != 0 || staleRecreated != 0 {
				t.Fatalf("stale not-found after create + Add: %d of %d new, %d of %d re-created", staleNew, fresh, staleRecreated, recreated)
			}
		})
	}
}

// TestAddDropsAnEarlierLifeAndBeatsAMarkerLoad: Add drops what Redis holds
// for the ID, in one round trip: the value of a life before a delete whose
// invalidation had not landed (chaos seed 1 found a Get answering it after
// the re-create's Add returned, while Add dropped markers only); a load that
// read "absent" before the create cannot write its marker after the Add.
func TestAddDropsAnEarlierLifeAndBeatsAMarkerLoad(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 10, nil)
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	flush(t, g) // the Get answered as the load returned; the write follows
	c.Counter.Reset()
	if err := g.Add(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if n := c.Counter.RoundTrips(); n != 1 {
		t.Fatalf("Add of one ID took %d round trips, want 1", n)
	}
	c.Counter.Reset()
	if err := g.Add(ctx, "a", "b", "c", "d", "e"); err != nil {
		t.Fatal(err)
	}
	if n := c.Counter.RoundTrips(); n != 1 {
		t.Fatalf("Add of five IDs took %d round trips, want 1", n)
	}
	// p1 was deleted and created again in the database, and the delete's
	// invalidation has not reached Redis (a follower's lag): the Add of the
	// re-create drops the cached value of before.
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	flush(t, g)
	d.set(product{ID: "p1", Price: 9})
	if err := g.Add(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 9 {
		t.Fatalf("after the re-create's Add: %+v, %v, want price 9, not the value of before the delete", p, err)
	}

	// A slow load of "late" reads "absent", then the row is created and
	// Added before the load writes its marker.
	slow, read, resume := pausedAfterRead(d)
	if err := g.Add(ctx, "late"); err != nil { // known to the filter, not yet in the DB
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := guard.Get(ctx, g, "late", slow); got <- err }()
	<-read
	d.set(product{ID: "late", Price: 7})
	if err := g.Add(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	close(resume)
	// Its marker write is refused (Add deleted the lock): it loads again
	// and answers the created row.
	if err := <-got; err != nil {
		t.Fatalf("the Get that started before the create: %v, want the row its second load read", err)
	}
	if p, err := guard.Get(ctx, g, "late", d.load); err != nil || p.Price != 7 {
		t.Fatalf("after the create: %+v, %v", p, err)
	}
	flush(t, g) // the overtaken flight's refused write may still be under way
	if st := g.Stats(); st.StaleWrites != 1 {
		t.Fatalf("the marker write was not refused: %+v", st)
	}
}

// TestSetWritesThrough: after Set, every process reads the new value without
// a load; Set is one round trip and beats a slow load in flight.
func TestSetWritesThrough(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g1, g2, d := twoGuards(t, 10, nil)
	if _, err := guard.Get(ctx, g2, "p4", d.load); err != nil {
		t.Fatal(err)
	}
	d.set(product{ID: "p4", Price: 44})
	c.Counter.Reset()
	if err := guard.Set(ctx, g1, "p4", product{ID: "p4", Price: 44}); err != nil {
		t.Fatal(err)
	}
	if n := c.Counter.RoundTrips(); n != 1 {
		t.Fatalf("Set took %d round trips, want 1", n)
	}
	loads := d.calls.Load()
	if p, err := guard.Get(ctx, g2, "p4", d.load); err != nil || p.Price != 44 || d.calls.Load() != loads {
		t.Fatalf("after Set: %+v, %v, %d loads", p, err, d.calls.Load()-loads)
	}
	// Set registers new IDs in the filter too.
	d.set(product{ID: "brand-new", Price: 5})
	if err := guard.Set(ctx, g1, "brand-new", product{ID: "brand-new", Price: 5}); err != nil {
		t.Fatal(err)
	}
	if ok, err := g2.MayExist(ctx, "brand-new"); !ok || err != nil {
		t.Fatalf("Set did not register the ID: %v %v", ok, err)
	}

	// A slow load that read the old row cannot overwrite the Set.
	slow, read, resume := pausedAfterRead(d)
	got := make(chan product, 1)
	go func() { p, _ := guard.Get(ctx, g2, "p5", slow); got <- p }()
	<-read
	d.set(product{ID: "p5", Price: 55})
	if err := guard.Set(ctx, g1, "p5", product{ID: "p5", Price: 55}); err != nil {
		t.Fatal(err)
	}
	close(resume)
	<-got
	if p, err := guard.Get(ctx, g1, "p5", d.load); err != nil || p.Price != 55 {
		t.Fatalf("a slow load overwrote the Set: %+v, %v", p, err)
	}
}

// TestDeleteAnswersNotFoundWithoutALoad: after Delete, every process answers
// ErrNotFound from the marker, without calling the loader.
func TestDeleteAnswersNotFoundWithoutALoad(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	_, g1, g2, d := twoGuards(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	if _, err := guard.Get(ctx, g2, "p6", d.load); err != nil {
		t.Fatal(err)
	}
	d.del("p6")
	if err := g1.Delete(ctx, "p6"); err != nil {
		t.Fatal(err)
	}
	loads := d.calls.Load()
	for _, g := range []*guard.Guard{g1, g2} {
		// g2 holds p6 in memory until the invalidation message arrives.
		waitFor(t, func() bool {
			_, err := guard.Get(ctx, g, "p6", d.load)
			return errors.Is(err, guard.ErrNotFound)
		})
	}
	if n := d.calls.Load() - loads; n != 0 {
		t.Fatalf("the loader ran %d times after Delete", n)
	}
}

// TestOneTypePerGuard: a Guard read with one type refuses another, at the
// second binding, instead of evicting entries as corrupt.
func TestOneTypePerGuard(t *testing.T) {
	ctx := context.Background()
	_, g, d := setup(t, 10, nil)
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	str := func(context.Context, string) (string, error) { return "x", nil }
	if _, err := guard.Get(ctx, g, "p1", str); !errors.Is(err, guard.ErrWrongType) {
		t.Fatalf("Get with another type: %v, want ErrWrongType", err)
	}
	if _, err := guard.For(g, str); !errors.Is(err, guard.ErrWrongType) {
		t.Fatalf("For with another type: %v, want ErrWrongType", err)
	}
	if err := guard.Set(ctx, g, "p1", "x"); !errors.Is(err, guard.ErrWrongType) {
		t.Fatalf("Set with another type: %v, want ErrWrongType", err)
	}
	if st := g.Stats(); st.CorruptValues != 0 || st.Loads != 1 {
		t.Fatalf("stats %+v", st)
	}
	products, err := guard.For(g, d.load)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := products.Get(ctx, "p1"); err != nil || p.Price != 1 {
		t.Fatalf("typed Get: %+v, %v", p, err)
	}
}

// TestVersionsKeepSeparateEntriesAndWritesDropAll: two schema versions of one
// Guard (as in a rolling deploy) cache side by side without evicting each
// other, and a write through either drops both.
func TestVersionsKeepSeparateEntriesAndWritesDropAll(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, gOld, d := setup(t, 10, nil)
	type productV2 struct {
		ID    string
		Cents int64 // renamed field: v1 entries do not decode into it
	}
	gNew, err := guard.New(
		ctx,
		redistest.Connect(t),
		"product",
		&guard.Options{KeyPrefix: c.Prefix, Version: "2", Filter: guard.FilterOptions{ExpectedItems: 10_000}},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer gNew.Close()
	var newLoads atomic.Int32
	loadV2 := func(ctx context.Context, id string) (productV2, error) {
		newLoads.Add(1)
		p, err := d.load(ctx, id)
		return productV2{ID: p.ID, Cents: int64(p.Price) * 100}, err
	}
	for range 3 {
		if p, err := guard.Get(ctx, gOld, "p2", d.load); err != nil || p.Price != 2 {
			t.Fatalf("v1: %+v %v", p, err)
		}
		if p, err := guard.Get(ctx, gNew, "p2", loadV2); err != nil || p.Cents != 200 {
			t.Fatalf("v2: %+v %v", p, err)
		}
	}
	if newLoads.Load() != 1 || gOld.Stats().Loads != 1 || gOld.Stats().CorruptValues+gNew.Stats().CorruptValues != 0 {
		t.Fatalf("versions evicted each other: v1 %+v, v2 loads %d", gOld.Stats(), newLoads.Load())
	}
	// An old process's write drops the new version's entry too.
	d.set(product{ID: "p2", Price: 3})
	if err := gOld.Invalidate(ctx, "p2"); err != nil {
		t.Fatal(err)
	}
	if p, err := guard.Get(ctx, gNew, "p2", loadV2); err != nil || p.Cents != 300 {
		t.Fatalf("v2 after a v1 Invalidate: %+v %v", p, err)
	}
	// And a new process's Set drops the old version's.
	d.set(product{ID: "p2", Price: 4})
	if err := guard.Set(ctx, gNew, "p2", productV2{ID: "p2", Cents: 400}); err != nil {
		t.Fatal(err)
	}
	if p, err := guard.Get(ctx, gOld, "p2", d.load); err != nil || p.Price != 4 {
		t.Fatalf("v1 after a v2 Set: %+v %v", p, err)
	}
}

// holdRelease is a redis.Hook that holds the load holder's last step (the
// script that writes, releases and publishes) until released: after it ran
// and before its reply reaches the flight (the flight has cached its value
// but not yet heard so), or with before set, before it is sent (nothing is
// cached yet).
type holdRelease struct {
	channel string        // the Guard's "loaded" channel, an argument of that script
	before  bool          // hold the script before it runs
	held    chan struct{} // closed when the script is held
	release chan struct{}
	once    sync.Once
}

func (h *holdRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.before {
			for _, cmd := range cmds {
				h.hold(cmd)
			}
			return next(ctx, cmds)
		}
		err := next(ctx, cmds)
		for _, cmd := range cmds { // the write goes in a pipeline (loader's trip batching)
			h.hold(cmd)
		}
		return err
	}
}
func (h *holdRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.before {
			h.hold(cmd)
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		h.hold(cmd)
		return err
	}
}

// hold holds the first script call with the channel among its arguments
// that ran (or, before, the first one): the EVALSHA, or the EVAL after a
// NOSCRIPT (a server that has not loaded the script answers NOSCRIPT to
// the EVALSHA).
func (h *holdRelease) hold(cmd redis.Cmder) {
	if cmd.Err() == nil && slices.Contains(cmd.Args(), any(h.channel)) {
		h.once.Do(func() { close(h.held); <-h.release })
	}
}

// TestNoAnswerFromAFlightOlderThanTheGet: a Get that starts after another
// process's write returned is not answered by a flight of its own process
// that loaded before the write (here: held after its cache write, before it
// answered), but by a newer read.
func TestNoAnswerFromAFlightOlderThanTheGet(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g1, d := setup(t, 10, nil)
	c2 := redistest.Connect(t)
	h := &holdRelease{channel: c.Prefix + ":product:loaded", held: make(chan struct{}), release: make(chan struct{})}
	c2.AddHook(h)
	g2, err := guard.New(ctx, c2, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	first := make(chan product, 1)
	go func() { p, _ := guard.Get(ctx, g2, "p7", d.load); first <- p }()
	<-h.held // g2's flight loaded p7 (price 7), cached it, and has not answered yet
	d.set(product{ID: "p7", Price: 77})
	if err := g1.Invalidate(ctx, "p7"); err != nil { // the next Get misses, and would join that flight
		t.Fatal(err)
	}
	second := make(chan product, 1)
	go func() { p, _ := guard.Get(ctx, g2, "p7", d.load); second <- p }()
	waitJoined(t, 1) // the second Get reached the flight while it is held
	close(h.release)
	if p := <-first; p.Price != 7 && p.Price != 77 {
		t.Fatalf("first Get: %+v", p)
	}
	if p := <-second; p.Price != 77 {
		t.Fatalf("a Get that started after the Invalidate returned got %+v, want price 77", p)
	}
}

// pausedAfterRead wraps d.load: its first call reads the row, then closes
// read and waits for resume before it returns what it read.
func pausedAfterRead(d *db) (slow func(context.Context, string) (product, error), read, resume chan struct{}) {
	read, resume = make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	slow = func(ctx context.Context, id string) (product, error) {
		p, err := d.load(ctx, id)
		if once.CompareAndSwap(false, true) {
			close(read)
			<-resume
		}
		return p, err
	}
	return slow, read, resume
}

// TestMissAnswersAfterItsWrite: a miss answers its callers only once the
// holder's write, release and publish have run in Redis (held here before
// they are sent), so that a process that exits as its Gets return leaves
// no lock behind (TestStampedeOfExitingProcesses); right after the Get the
// entry is in Redis and the lock is gone, with no Flush.
func TestMissAnswersAfterItsWrite(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, _, d := setup(t, 10, nil)
	c2 := redistest.Connect(t)
	h := &holdRelease{channel: c.Prefix + ":product:loaded", before: true, held: make(chan struct{}), release: make(chan struct{})}
	c2.AddHook(h)
	g, err := guard.New(ctx, c2, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	if err != nil {
		t.Fatal(err)
	}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(h.release) }) }
	defer g.Close()
	defer release() // before Close, which waits for the held flight
	got := make(chan product, 1)
	go func() { p, _ := guard.Get(ctx, g, "p7", d.load); got <- p }()
	<-h.held                          // the flight's write is held before it was sent
	time.Sleep(50 * time.Millisecond) // room for an answer that must not come: nothing to wait on
	select {
	case p := <-got:
		t.Fatalf("the miss answered %+v before its write was sent", p)
	default:
	}
	release()
	if p := <-got; p.Price != 7 {
		t.Fatalf("miss: %+v", p)
	}
	if n := c.Exists(ctx, c.Prefix+":product:{p7}").Val(); n != 1 {
		t.Fatal("the miss answered and p7 is not cached")
	}
	if n := c.Exists(ctx, c.Prefix+":product:{p7}:lock").Val(); n != 0 {
		t.Fatal("the miss answered and its lock is still held")
	}
	if st := g.Stats(); st.Loads != 1 || st.StaleWrites != 0 {
		t.Fatalf("stats %+v, want one load and no refused write", st)
	}
}

// TestInvalidateAll: every entry and marker of the Guard goes in one call,
// and a load that read the old row before the call cannot cache it after:
// the scan finds its lock and deletes it. Another Guard's entries stay.
// Control: with a scan of value keys alone (the lock not found), the
// overtaken load caches the old row and the test fails.
func TestInvalidateAll(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 10, nil)
	other, err := guard.New(ctx, c, "product2", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Rebuild(ctx, ids("p", 10), nil); err != nil {
		t.Fatal(err)
	}
	cache(t, g, d, "p0", "p1")
	cache(t, other, d, "p0")
	if _, err := guard.Get(ctx, g, "p9x", d.load); !errors.Is(err, guard.ErrNotFound) { // a marker, or rejected
		t.Fatal(err)
	}
	slow := overtake(t, g, d, "p3") // its load has the old row, under the key's lock
	for _, id := range []string{"p0", "p1", "p3"} {
		d.set(product{ID: id, Name: "new", Price: 100})
	}
	n, err := g.InvalidateAll(ctx)
	p := slow.finish()
	if err != nil {
		t.Fatal(err)
	}
	if p.Price != 100 {
		t.Fatalf("the overtaken Get returned %+v, want the new row", p)
	}
	if n < 3 {
		t.Fatalf("InvalidateAll dropped %d IDs, want p0, p1 and p3's lock at least", n)
	}
	flush(t, g)
	for _, id := range []string{"p0", "p1", "p3"} {
		if p, err := guard.Get(ctx, g, id, d.load); err != nil || p.Price != 100 {
			t.Fatalf("%s after InvalidateAll: %+v, %v; want the new row", id, p, err)
		}
	}
	if exists, err := c.Exists(ctx, c.Prefix+":product2:{p0}").Result(); err != nil || exists != 1 {
		t.Fatalf("the other Guard's entry: %d, %v; want it kept", exists, err)
	}
}
