package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestLocalCache: with Options.Local a repeated hit costs no round trip, and
// an Invalidate in another process (another Guard on its own client) drops
// this process's copy.
func TestLocalCache(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	c2 := redistest.Connect(t)
	other, err := guard.New(
		ctx,
		c2,
		"product",
		&guard.Options{KeyPrefix: c.Prefix, Local: &guard.LocalOptions{}, Filter: guard.FilterOptions{ExpectedItems: 10_000}},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 1 {
		t.Fatalf("first Get: %+v, %v", p, err)
	}
	flush(t, g) // the Get answered as the load returned; the write follows
	c.Counter.Reset()
	for range 100 {
		if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 1 {
			t.Fatalf("local Get: %+v, %v", p, err)
		}
	}
	if n := c.Counter.RoundTrips(); n != 0 {
		t.Fatalf("100 local hits cost %d round trips", n)
	}
	if st := g.Stats(); st.LocalHits != 100 {
		t.Fatalf("stats %+v", st)
	}

	d.set(product{ID: "p1", Name: "new", Price: 10})
	if err := other.Invalidate(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the other process's Invalidate reached the local copy", func() bool {
		p, err := guard.Get(ctx, g, "p1", d.load)
		if err != nil {
			t.Fatal(err)
		}
		return p.Price == 10
	})
}

// TestLocalCacheTTLAndSize: an entry is served from memory for TTL at most,
// and the cache keeps at most Size entries.
func TestLocalCacheTTLAndSize(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 200, &guard.Options{Local: &guard.LocalOptions{TTL: 50 * time.Millisecond, Size: 64}})
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	flush(t, g) // the Get answered as the load returned; the write follows
	eventually(t, 5*time.Second, "the copy's local TTL to pass", func() bool { return guard.LocalCopy(g, "p1") == "none" })
	c.Counter.Reset()
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	if c.Counter.RoundTrips() != 1 {
		t.Fatalf("an expired local entry must be read from Redis again: %d round trips", c.Counter.RoundTrips())
	}
	for i := range 200 {
		if _, err := guard.Get(ctx, g, fmt.Sprintf("p%d", i), d.load); err != nil {
			t.Fatal(err)
		}
	}
	// Not more than Size (rounded up to the 16 shards) are kept: the rest
	// cost a round trip again.
	c.Counter.Reset()
	for i := range 200 {
		if _, err := guard.Get(ctx, g, fmt.Sprintf("p%d", i), d.load); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Counter.RoundTrips(); n < 200-64 {
		t.Fatalf("%d round trips for 200 keys: more than Size entries were kept", n)
	}
}

// TestLocalCopyNeverOutlivesRedis: with a local TTL of a minute and a Redis
// TTL of 300ms, the copy in memory goes when the entry in Redis does: the
// next Get after that loads again.
func TestLocalCopyNeverOutlivesRedis(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{TTL: 300 * time.Millisecond, Jitter: -1, Local: &guard.LocalOptions{TTL: time.Minute}})
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil { // loads; the copy lives as long as the entry
		t.Fatal(err)
	}
	if _, err := guard.Get(ctx, g, "p2", d.load); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.Get(ctx, g, "p2", d.load); err != nil { // the copy from a Redis hit: its PTTL bounds it
		t.Fatal(err)
	}
	if st := g.Stats(); st.LocalHits != 1 {
		t.Fatalf("stats %+v: want the second Get of p2 from memory", st)
	}
	eventually(t, 5*time.Second, "both entries to expire in Redis", func() bool {
		for _, id := range []string{"p1", "p2"} { // one key per EXISTS: in a cluster they are in two slots
			if n, err := c.Exists(ctx, c.Prefix+":product:{"+id+"}").Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	})
	calls := d.calls.Load()
	for _, id := range []string{"p1", "p2"} {
		if _, err := guard.Get(ctx, g, id, d.load); err != nil {
			t.Fatal(err)
		}
	}
	if n := d.calls.Load() - calls; n != 2 {
		t.Fatalf("%d loads after the Redis TTL ran out, want 2: a local copy outlived its entry", n)
	}
}

// TestLocalLateCallerSharesTheLoad: with Options.Local, a caller that
// arrives while a load of its key is under way takes that load's answer
// when no write was heard in between (without Local it reads again once
// that flight ended, to see any write that returned before it started; a
// local copy has the same window).
func TestLocalLateCallerSharesTheLoad(t *testing.T) {
	t.Parallel() // its own keys, no process-wide state: runs beside the others
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		opts   *guard.Options
		hgets  int  // from the late caller's read on
		flight bool // the late caller reads again after the first flight
	}{
		{"local", &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}}, 1, false},
		{"no local", nil, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warmScripts(t)
			c, g, d := setup(t, 10, tc.opts)
			before := g.Stats()
			gl := gateLoads(d)
			load, entered, release, loads := gl.load, gl.entered, gl.release, &gl.calls
			errs := make(chan error, 2)
			go func() { _, err := guard.Get(ctx, g, "p1", load); errs <- err }()
			<-entered // the first caller's flight is loading
			c.Counter.Reset()
			go func() { _, err := guard.Get(ctx, g, "p1", load); errs <- err }()
			waitJoined(t, 1) // the late caller has read and joined the flight (checked below)
			close(release)
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if n := loads.Load(); n != 1 {
				t.Fatalf("%d loads, want 1", n)
			}
			flush(t, g) // the first flight's write follows its answers
			// The late caller is answered by the first flight (coalesced), or
			// by a read of its own after it, which finds what it wrote (a hit).
			st := g.Stats()
			want := [2]uint64{1, 0} // coalesced, hits
			if tc.flight {
				want = [2]uint64{0, 1}
			}
			if got := [2]uint64{st.Coalesced - before.Coalesced, st.Hits - before.Hits}; got != want {
				t.Fatalf("late caller: %d coalesced, %d hits, want %v (%+v)", got[0], got[1], want, st)
			}
			// The late caller's read (an HGET); without Local also its
			// read after the first flight.
			if n := c.Counter.Names()["hget"]; n != tc.hgets {
				t.Fatalf("%d HGETs from the late caller's read on, want %d (%v)", n, tc.hgets, c.Counter.Names())
			}
			if n := c.Counter.Names()["set"]; n != 0 { // a read answered: no flight, no lock attempt
				t.Fatalf("the late caller made %d lock attempts, want 0 (%v)", n, c.Counter.Names())
			}
			if !tc.flight && c.Counter.RoundTrips() != 2 { // and the first flight's write
				t.Fatalf("%d round trips from the late caller's read on, want 2 (%v)", c.Counter.RoundTrips(), c.Counter.Names())
			}
		})
	}
}

// TestLocalCallersShareOneRead: with Options.Local, the callers of an ID
// that this process holds no copy of share one Redis read (a hot key whose
// copy just expired sends one, not one per caller). Redis is paused while
// they arrive, so that they all find the first read under way.
func TestLocalCallersShareOneRead(t *testing.T) {
	t.Parallel() // its own keys, no process-wide state: runs beside the others
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	other := otherProcess(t, c)
	if _, err := guard.Get(ctx, other, "p1", d.load); err != nil { // in Redis, not in g's memory
		t.Fatal(err)
	}
	flush(t, other) // the Get answered as the load returned; the write follows
	if err := c.ForEachNode(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Do(ctx, "client", "pause", 300, "all").Err()
	}); err != nil {
		t.Fatal(err)
	}
	c.Counter.Reset()
	const callers = 16
	errs := make(chan error, callers)
	for range callers {
		go func() {
			p, err := guard.Get(ctx, g, "p1", d.load)
			if err == nil && p.Price != 1 {
				err = fmt.Errorf("got %+v", p)
			}
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Counter.Names()["hget"]; n != 1 {
		t.Fatalf("%d callers sent %d HGETs, want 1 (%v)", callers, n, c.Counter.Names())
	}
	if n := d.calls.Load(); n != 1 { // other's load only
		t.Fatalf("%d loads, want 1", n)
	}
}

// TestLocalExpiredCopySkipsTheRead: a local copy that lived as long as its
// Redis entry tells the Get after it that Redis has nothing to read: that
// Get goes straight to the lock attempt (whose re-check reads the entry) and
// the write, two round trips instead of three. If another process stored
// the ID meanwhile, the re-check serves what it stored: no load.
func TestLocalExpiredCopySkipsTheRead(t *testing.T) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	opts := &guard.Options{TTL: ttl, Jitter: -1, Local: &guard.LocalOptions{TTL: time.Minute}}
	c, g, d := setup(t, 10, opts)
	// untilLoaded asks id through get every few milliseconds (a local hit costs
	// no round trip) until a Get loads, and returns that Get's round trips.
	untilLoaded := func(get func() (product, error)) (p product, trips int64) {
		t.Helper()
		calls := d.calls.Load()
		eventually(t, 5*time.Second, "the entry expired", func() bool {
			c.Counter.Reset()
			var err error
			if p, err = get(); err != nil {
				t.Fatal(err)
			}
			if d.calls.Load() == calls {
				return false
			}
			flush(t, g) // the Get answered as the load returned; g's write follows
			trips = c.Counter.RoundTrips()
			return true
		})
		return p, trips
	}
	mine := func() (product, error) { return guard.Get(ctx, g, "p1", d.load) }
	if _, err := mine(); err != nil { // loads: the copy lives as long as the entry
		t.Fatal(err)
	}
	if _, n := untilLoaded(mine); n != 2 {
		t.Fatalf("the Get after the copy and its entry expired cost %d round trips, want 2 (lock attempt, write): %v", n, c.Counter.Names())
	}
	if n := c.Counter.Names()["hget"]; n != 1 {
		t.Fatalf("%d HGETs, want only the lock attempt's re-check (%v)", n, c.Counter.Names())
	}

	// Another process reloads p1 (a new price) after the entry expired:
	// this process's next Get finds it in the re-check and loads nothing.
	// First make sure this process holds a copy: its own load's publish
	// may have dropped the one it kept (it cannot tell its own message).
	eventually(t, 5*time.Second, "its own publish to drop the copy", func() bool { return guard.LocalCopy(g, "p1") == "none" })
	if _, err := mine(); err != nil {
		t.Fatal(err)
	}
	d.set(product{ID: "p1", Name: "new", Price: 42})
	other := otherProcess(t, c)
	if _, err := guard.Get(ctx, other, "p1", d.load); err != nil { // a hit on the entry this process loaded
		t.Fatal(err)
	}
	if p, _ := untilLoaded(func() (product, error) { return guard.Get(ctx, other, "p1", d.load) }); p.Price != 42 {
		t.Fatalf("the other process loaded %+v", p)
	}
	flush(t, other) // its Get answered as the load returned; the write follows
	flush(t, g)     // this process's flights have written what they loaded
	calls := d.calls.Load()
	c.Counter.Reset()
	p, err := mine()
	if err != nil || p.Price != 42 {
		t.Fatalf("after the other process's load: %+v, %v, want price 42", p, err)
	}
	if n := d.calls.Load() - calls; n != 0 {
		t.Fatalf("%d loads: the re-check missed what the other process stored", n)
	}
	// No read: the lock attempt (SET NX and the lock's PTTL) and its
	// re-check (HGET and the entry's PTTL, to keep what it finds) answered,
	// and the release followed. That is what skipping the read costs when
	// another process was first.
	if names := c.Counter.Names(); names["pttl"] != 2 || names["hget"] != 1 || names["set"] != 1 {
		t.Fatalf("want the lock attempt and its re-check's HGET only, no read: %v", names)
	}
}

// TestLocalKeepsWhatTheRecheckFound: a copy that expired in memory while
// its entry still lives in Redis (the flight that loaded it kept it as
// the load returned, and its write reached Redis later) sends the next Get
// to a flight, whose re-check finds the entry. The flight keeps what it
// found, for the entry's remaining TTL, so the Gets after it are local
// hits again. It used to keep nothing: every Get until the entry expired
// in Redis ran a flight of its own, a lock attempt and a release each.
func TestLocalKeepsWhatTheRecheckFound(t *testing.T) {
	ctx := context.Background()
	const ttl = 200 * time.Millisecond
	c, g, d := setup(t, 10, &guard.Options{TTL: ttl, Jitter: -1, Local: &guard.LocalOptions{TTL: time.Minute}})
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil { // loads: the copy lives as long as the entry
		t.Fatal(err)
	}
	flush(t, g)
	// The entry outlives the copy, as when the write lands after it was kept.
	vkey := c.Prefix + ":product:{p1}"
	if err := c.PExpire(ctx, vkey, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the copy to expire (goneGrace keeps it known)", func() bool { return guard.LocalCopy(g, "p1") == "gone" })
	calls := d.calls.Load()
	c.Counter.Reset()
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.ID != "p1" {
		t.Fatalf("%+v, %v", p, err)
	}
	flush(t, g)
	if n := c.Counter.Names()["set"]; n != 1 {
		t.Fatalf("the Get after the copy expired: %v, want one lock attempt", c.Counter.Names())
	}
	c.Counter.Reset()
	hits := g.Stats().LocalHits
	for range 20 {
		if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.ID != "p1" {
			t.Fatalf("%+v, %v", p, err)
		}
	}
	if n := c.Counter.RoundTrips(); n != 0 || g.Stats().LocalHits != hits+20 {
		t.Fatalf("20 Gets after the re-check found the entry: %d round trips (%v), %d local hits; want local hits",
			n, c.Counter.Names(), g.Stats().LocalHits-hits)
	}
	if n := d.calls.Load() - calls; n != 0 {
		t.Fatalf("%d loads, want none: the entry was in Redis all along", n)
	}
}

// TestLocalKeepsWhatTheFlightLoaded: the flight puts what it loaded in the
// local cache before it ends, even when the caller that started it has
// left: the next Get is answered from memory (0 round trips). It used to
// be the caller's job after the flight, so a caller that gave up kept
// nothing, and a caller arriving between the end of the flight and that
// put found the old copy gone and ran a flight of its own.
func TestLocalKeepsWhatTheFlightLoaded(t *testing.T) {
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	entered, release := make(chan struct{}), make(chan struct{})
	load := func(ctx context.Context, id string) (product, error) {
		close(entered)
		<-release
		return d.load(ctx, id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { _, err := guard.Get(ctx, g, "p1", load); errs <- err }()
	<-entered
	cancel() // the caller leaves; its flight goes on
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left: %v", err)
	}
	close(release)
	flush(t, g) // the flight wrote p1 and kept its copy
	c.Counter.Reset()
	hits := g.Stats().LocalHits
	if p, err := guard.Get(context.Background(), g, "p1", d.load); err != nil || p.ID != "p1" {
		t.Fatalf("%+v, %v", p, err)
	}
	if n := c.Counter.RoundTrips(); n != 0 || g.Stats().LocalHits != hits+1 {
		t.Fatalf("%d round trips, %d local hits: the flight kept no copy of what it loaded", n, g.Stats().LocalHits-hits)
	}
}

// TestLateCallersShareTheirReadAgain: without Options.Local, callers that
// joined a flight older than them (its load was under way when they
// started) read again once it ended, and share that read: one HGET for
// all of them after their own first reads, not one each, and no flight
// (lock attempt) of their own.
func TestLateCallersShareTheirReadAgain(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, nil)
	h := hooked(c)
	cache(t, g, d, "p2") // loads the scripts
	gl := gateLoads(d)
	load, entered, release := gl.load, gl.entered, gl.release
	errs := make(chan error, 21)
	go func() { _, err := guard.Get(ctx, g, "p1", load); errs <- err }()
	<-entered // the first caller's flight is loading
	c.Counter.Reset()
	const late = 20
	for range late {
		go func() {
			p, err := guard.Get(ctx, g, "p1", load)
			if err == nil && p.Price != 1 {
				err = fmt.Errorf("got %+v", p)
			}
			errs <- err
		}()
	}
	waitJoined(t, late) // every late caller has read (and missed) and joined the flight
	c.Counter.Reset()   // their first reads (which may share HGETs: TestSameKeyReadsShareOneHGET) are done
	// The read again is held before it is sent until every other late
	// caller has joined it.
	root := redistest.GoID()
	vkey := c.Prefix + ":product:{p1}"
	var held atomic.Bool
	hold := func(cmd redis.Cmder) {
		if a := cmd.Args(); cmd.Name() != "hget" || len(a) < 2 || a[1] != vkey || !held.CompareAndSwap(false, true) {
			return
		}
		// Callers that never join: the test fails on its counts after 10 s, not by hanging.
		redistest.Poll(10*time.Second, func() bool { return joinedReads(root) >= late-1 })
	}
	h.sending.Store(&hold)
	defer h.sending.Store(nil)
	close(release)
	for range late + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	flush(t, g)
	// One shared read again (held until all joined), not one per late caller.
	if n := c.Counter.Names()["hget"]; n != 1 {
		t.Fatalf("%d HGETs after the flight, want one shared read (%v)", n, c.Counter.Names())
	}
	if n := c.Counter.Names()["set"]; n != 0 {
		t.Fatalf("%d lock attempts after the first flight's, want 0 (%v)", n, c.Counter.Names())
	}
}

// gatedLoads wraps d.load: each call is counted, tells entered (buffer 4),
// and waits until release is closed.
type gatedLoads struct {
	d                *db
	entered, release chan struct{}
	calls            atomic.Int32
}

func gateLoads(d *db) *gatedLoads {
	return &gatedLoads{d: d, entered: make(chan struct{}, 4), release: make(chan struct{})}
}

func (gl *gatedLoads) load(ctx context.Context, id string) (product, error) {
	gl.calls.Add(1)
	gl.entered <- struct{}{}
	<-gl.release
	return gl.d.load(ctx, id)
}

// tagged has slices and a map: the local cache hands each caller a deep
// copy of the value it keeps decoded.
type tagged struct {
	ID    string
	Tags  []string
	Attrs map[string]int
}

func taggedRow(id string) tagged {
	return tagged{ID: id, Tags: []string{"red", "large"}, Attrs: map[string]int{"stock": 3}}
}

// TestLocalHitsHandOutCopies: a value kept decoded in memory is never
// reachable by a caller. Whatever a caller (or the application, after Set)
// changes in the value it holds, the next local hit answers the row as it
// was: through a miss's flight, a read that hit, GetMany, and Set. Each
// next Get is a local hit (no round trip; after Set, see there).
func TestLocalHitsHandOutCopies(t *testing.T) {
	ctx := context.Background()
	c, g, _ := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	load := func(_ context.Context, id string) (tagged, error) { return taggedRow(id), nil }
	loadMany := func(_ context.Context, ids []string) (map[string]tagged, error) {
		out := map[string]tagged{}
		for _, id := range ids {
			out[id] = taggedRow(id)
		}
		return out, nil
	}
	spoil := func(v tagged) {
		v.Tags[0] = "spoiled"
		v.Attrs["stock"] = -1
		v.Attrs["new"] = 1
	}
	// next spoils what a Get answered, then checks that a local hit
	// answers the row as it was, and spoils that too.
	next := func(how, id string, maxTrips int64) {
		t.Helper()
		flush(t, g) // writes and lock releases that follow answers are not these Gets' round trips
		c.Counter.Reset()
		for range 2 {
			v, err := guard.Get(ctx, g, id, load)
			if err != nil {
				t.Fatal(err)
			}
			if want := taggedRow(id); v.Tags[0] != want.Tags[0] || len(v.Attrs) != 1 || v.Attrs["stock"] != 3 {
				t.Fatalf("%s: a local hit answered %+v after a caller changed its value; want %+v", how, v, want)
			}
			spoil(v)
		}
		if n := c.Counter.RoundTrips(); n > maxTrips {
			t.Fatalf("%s: the Gets after it cost %d round trips (%v); want local hits", how, n, c.Counter.Names())
		}
	}

	// A miss: the flight keeps the value, and answers the caller that started it.
	v, err := guard.Get(ctx, g, "p1", load)
	if err != nil {
		t.Fatal(err)
	}
	flush(t, g)
	spoil(v)
	next("after a miss", "p1", 0)

	// A read that hit in Redis: another process filled the entry.
	other, err := guard.New(
		ctx,
		redistest.Connect(t),
		"product",
		&guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := guard.Get(ctx, other, "p2", load); err != nil {
		t.Fatal(err)
	}
	flush(t, other)
	before := g.Stats()
	if v, err = guard.Get(ctx, g, "p2", load); err != nil {
		t.Fatal(err)
	}
	// Its read may take the lock (the miss of p1 opened the gate, see
	// TestReadLockWithLocal) and give it back: it loads nothing.
	if st := g.Stats(); st.Hits != before.Hits+1 || st.Loads != before.Loads {
		t.Fatalf("the Get of p2: %d hits, %d loads; want a Redis hit", st.Hits-before.Hits, st.Loads-before.Loads)
	}
	spoil(v)
	next("after a Redis hit", "p2", 0)

	// GetMany.
	many, err := guard.GetMany(ctx, g, []string{"p3", "p4"}, loadMany)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range many {
		spoil(v)
	}
	next("after GetMany", "p3", 0)

	// Set: the application goes on changing the value it wrote through.
	row := taggedRow("p5")
	if err := guard.Set(ctx, g, "p5", row); err != nil {
		t.Fatal(err)
	}
	spoil(row)
	// Set keeps its copy, but its PUBLISH reaches this process's own
	// subscriber too, at a time of its own, and that drops the copy (see
	// LocalOptions): each Get here may read Redis once before it lands.
	next("after Set", "p5", 2)
}

// TestLocalCopiesAreCallersOwn: goroutines that change the values of
// their local hits at once never see each other's changes. Under -race (as
// make test runs it) a copy that shared storage would also be reported as
// a data race.
func TestLocalCopiesAreCallersOwn(t *testing.T) {
	ctx := context.Background()
	_, g, _ := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	load := func(_ context.Context, id string) (tagged, error) { return taggedRow(id), nil }
	if _, err := guard.Get(ctx, g, "p1", load); err != nil {
		t.Fatal(err)
	}
	flush(t, g)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				v, err := guard.Get(ctx, g, "p1", load)
				if err != nil {
					t.Error(err)
					return
				}
				if v.Tags[0] != "red" || v.Attrs["stock"] != 3 || len(v.Attrs) != 1 {
					t.Errorf("goroutine %d got %+v: another caller's change", w, v)
					return
				}
				v.Tags[0] = fmt.Sprint("goroutine ", w)
				v.Attrs["stock"] = w
				v.Attrs[fmt.Sprint(w)] = w
			}
		}()
	}
	wg.Wait()
	if st := g.Stats(); st.LocalHits < 1600 {
		t.Fatalf("stats %+v: want 1,600 local hits", st)
	}
}

// TestLocalRenewsOnceInTheBackground: a copy due for renewal (the last
// fifth of its life) is still served to every caller at once, and one of
// them starts one background read of its entry (HGET and PTTL, no probe).
// That read is held at Redis here: the callers send nothing meanwhile, and
// once it lands its copy replaces the one that was due.
func TestLocalRenewsOnceInTheBackground(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	h := hooked(c)
	cache(t, g, d, "p1") // the flight keeps its copy
	vkey := c.Prefix + ":product:{p1}"
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free() // before Close, which waits for the renewal
	var hgets atomic.Int32
	hold := func(cmd redis.Cmder) {
		if a := cmd.Args(); cmd.Name() == "hget" && len(a) > 1 && a[1] == vkey && hgets.Add(1) == 1 {
			close(entered)
			<-release
		}
	}
	h.sending.Store(&hold)
	defer h.sending.Store(nil)
	c.Counter.Reset()
	hits := g.Stats().LocalHits
	if !guard.DueNow(g, "p1") {
		t.Fatal("no copy of p1 after its load")
	}
	const callers, each = 8, 50
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 1 {
					t.Errorf("%+v, %v", p, err)
					return
				}
			}
		}()
	}
	served := make(chan struct{})
	go func() { wg.Wait(); close(served) }()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("callers waited for the renewal's read")
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal started")
	}
	// Counted as it was sent: the held renewal is the one round trip.
	if n, names := c.Counter.RoundTrips(), c.Counter.Names(); n != 1 || names["hget"] != 1 || names["pttl"] != 1 || len(names) != 2 {
		t.Fatalf("%d round trips (%v) while the renewal was held; want its HGET and PTTL alone", n, names)
	}
	if n := g.Stats().LocalHits - hits; n != callers*each {
		t.Fatalf("%d local hits, want %d", n, callers*each)
	}
	free()
	flush(t, g) // the renewal is the supervisor's
	if n := hgets.Load(); n != 1 {
		t.Fatalf("%d HGETs of p1, want one renewal", n)
	}
	if guard.LocalDue(g, "p1") || guard.LocalCopy(g, "p1") != "fresh" {
		t.Fatalf("after the renewal the copy is %s (due %v), want a fresh one", guard.LocalCopy(g, "p1"), guard.LocalDue(g, "p1"))
	}
}

// TestLocalResubscribeDropsCopies: messages published while the
// invalidation subscription's connection is down are lost, so the copies
// are dropped once go-redis has subscribed again: a lost message leaves a
// copy stale until the reconnection, not for the local TTL (a minute here).
// Redis kills the subscriber's connection (a private server: no other
// test's); the new subscription hears the writes made after it.
func TestLocalResubscribeDropsCopies(t *testing.T) {
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	g := openRebuilt(t, rdb, guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}}, 1000, 10)
	d := newDB(10)
	cache(t, g, d, "p1")
	if st := guard.LocalCopy(g, "p1"); st != "fresh" {
		t.Fatalf("copy %s after the load, want fresh", st)
	}
	if n, err := rdb.ClientKillByFilter(ctx, "type", "pubsub").Result(); err != nil || n == 0 {
		t.Fatalf("killed %d subscribers: %v", n, err)
	}
	eventually(t, 5*time.Second, "the resubscription to drop the copy", func() bool { return guard.LocalCopy(g, "p1") == "none" })
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil { // a copy again, from Redis
		t.Fatal(err)
	}
	if st := guard.LocalCopy(g, "p1"); st != "fresh" {
		t.Fatalf("copy %s after a read, want fresh", st)
	}
	ordb := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = ordb.Close() })
	other := openRebuilt(t, ordb, guard.Options{}, 1000, 10)
	if err := other.Invalidate(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the other process's write to drop the copy", func() bool { return guard.LocalCopy(g, "p1") == "none" })
}

// TestLocalRenewalAfterAWrite: a renewal that read an entry before a write
// of this process and stores its answer after the write returned leaves no
// older value served: the next Get answers the write's.
func TestLocalRenewalAfterAWrite(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	h := hooked(c)
	cache(t, g, d, "p1")
	vkey := c.Prefix + ":product:{p1}"
	read, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free()
	var hgets atomic.Int32
	hold := func(cmd redis.Cmder) { // after Redis answered: the renewal holds the entry as it was before the write
		if a := cmd.Args(); cmd.Name() == "hget" && len(a) > 1 && a[1] == vkey && hgets.Add(1) == 1 {
			close(read)
			<-release
		}
	}
	h.answered.Store(&hold)
	defer h.answered.Store(nil)
	if !guard.DueNow(g, "p1") {
		t.Fatal("no copy of p1 after its load")
	}
	hitStartsRenewal(t, g, d, read)
	if err := guard.Set(ctx, g, "p1", product{ID: "p1", Name: "new", Price: 2}); err != nil {
		t.Fatal(err)
	}
	free()
	flush(t, g) // the renewal is the supervisor's: it has stored its answer, or not
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 2 {
		t.Fatalf("after the write returned: %+v, %v; want its value (the renewal's older read was kept)", p, err)
	}
}

// TestLocalPeekThenAWriteHeard: a Get that answers with its Peek's read
// keeps no copy of it when a write of the ID from another process was heard
// between the two: the next Get reads the new value (before, the copy was
// kept for the whole local TTL).
func TestLocalPeekThenAWriteHeard(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	other, err := guard.New(ctx, redistest.Connect(t), "product",
		&guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := guard.Set(ctx, other, "p1", product{ID: "p1", Price: 1}); err != nil {
		t.Fatal(err)
	}
	cache(t, g, d, "p2") // binds g's type and arms its local cache
	eventually(t, 5*time.Second, "g's local cache armed", func() bool { return guard.LocalEpoch(g) > 0 })
	pctx, ok, err := g.Peek(ctx, "p1")
	if err != nil || !ok {
		t.Fatalf("Peek: %v, %v", ok, err)
	}
	epoch := guard.LocalEpoch(g)
	if err := guard.Set(ctx, other, "p1", product{ID: "p1", Name: "new", Price: 2}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "g heard the other process's write", func() bool { return guard.LocalEpoch(g) > epoch })
	if p, err := guard.Get(pctx, g, "p1", d.load); err != nil || p.Price != 1 {
		t.Fatalf("the Get behind the Peek: %+v, %v; want the Peek's read", p, err)
	}
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 2 {
		t.Fatalf("a Get after the write was heard: %+v, %v; want the new value (the Peek's read was kept)", p, err)
	}
}

// TestLocalRenewalUnderAFrozenRedis: a renewal started while Redis is
// frozen is bounded by RedisTimeout, so Close (which waits for it) returns
// well before Redis resumes, on README's client with no read timeout of its
// own (a client whose ctx does not bound its reads holds them until its
// ReadTimeout, renewal or not: docs/operations.md).
func TestLocalRenewalUnderAFrozenRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes Redis")
	}
	srv, _ := redistest.Private(t)
	o := srv.Options()
	o.ContextTimeoutEnabled, o.DialerRetries = true, 1 // README's client,
	o.ReadTimeout, o.WriteTimeout = -1, -1             // on which only a command's ctx bounds it
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	h := hooked(rdb)
	g := openRebuilt(t, rdb, guard.Options{Local: &guard.LocalOptions{TTL: time.Minute},
		Tuning: guard.Tuning{RedisTimeout: 300 * time.Millisecond}}, 1000, 10)
	d := newDB(10)
	cache(t, g, d, "p1")
	sent := make(chan struct{})
	var sentOnce sync.Once
	onSend := func(cmd redis.Cmder) { // the renewal's read goes to the frozen server
		if a := cmd.Args(); cmd.Name() == "hget" && len(a) > 1 && strings.HasSuffix(fmt.Sprint(a[1]), "{p1}") {
			sentOnce.Do(func() { close(sent) })
		}
	}
	h.sending.Store(&onSend)
	if !guard.DueNow(g, "p1") {
		t.Fatal("no copy of p1 after its load")
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var thawOnce sync.Once
	thaw := func() { thawOnce.Do(func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	time.AfterFunc(10*time.Second, thaw) // without the bound, Close waits for this
	hitStartsRenewal(t, g, d, sent)
	start := time.Now()
	_ = g.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v with a renewal under way and Redis frozen; want about RedisTimeout (300ms)", took)
	} else {
		t.Logf("Close took %v", took)
	}
}

// hitStartsRenewal gets p1 (price 1) from g's local copy, due for renewal,
// and waits until started says the renewal's read began.
func hitStartsRenewal(t *testing.T, g *guard.Guard, d *db, started <-chan struct{}) {
	t.Helper()
	if p, err := guard.Get(context.Background(), g, "p1", d.load); err != nil || p.Price != 1 {
		t.Fatalf("%+v, %v", p, err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal started")
	}
}
