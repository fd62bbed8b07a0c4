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

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// batchDB wraps db with a batch loader that records its calls.
type batchDB struct {
	*db
	mu    sync.Mutex
	calls [][]string
}

func (b *batchDB) loadMany(ctx context.Context, ids []string) (map[string]product, error) {
	b.mu.Lock()
	b.calls = append(b.calls, slices.Clone(ids))
	b.mu.Unlock()
	out := map[string]product{}
	for _, id := range ids {
		if p, err := b.db.load(ctx, id); err == nil {
			out[id] = p
		}
	}
	return out, nil
}

// TestGetMany: 100 warm IDs in one round trip; misses in one batch loader
// call; unknown IDs rejected without it; IDs the loader did not return get
// markers (so the next GetMany answers them without a load).
func TestGetMany(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 200, nil)
	b := &batchDB{db: d}
	var ids []string
	for i := range 100 {
		ids = append(ids, fmt.Sprintf("p%d", i))
	}
	// Cold: one batch call for the 100 misses.
	got, err := guard.GetMany(ctx, g, ids, b.loadMany)
	if err != nil || len(got) != 100 || got["p42"].Price != 42 {
		t.Fatalf("cold GetMany: %d values, %v", len(got), err)
	}
	if len(b.calls) != 1 || len(b.calls[0]) != 100 {
		t.Fatalf("batch calls %v, want one of 100 IDs", len(b.calls))
	}
	// Warm: one round trip, no load.
	c.Counter.Reset()
	got, err = guard.GetMany(ctx, g, ids, b.loadMany)
	if err != nil || len(got) != 100 || got["p7"].Price != 7 {
		t.Fatalf("warm GetMany: %d values, %v", len(got), err)
	}
	if n := c.Counter.RoundTrips(); n != 1 {
		t.Fatalf("warm GetMany of 100 IDs: %d round trips, want 1", n)
	}
	if len(b.calls) != 1 {
		t.Fatalf("warm GetMany loaded: %v", b.calls[1:])
	}
	// Unknown IDs are rejected without the loader; a known-to-the-filter
	// ID that the loader does not return gets a marker.
	if err := g.Add(ctx, "ghost"); err != nil {
		t.Fatal(err)
	}
	got, err = guard.GetMany(ctx, g, []string{"p1", "nope1", "nope2", "ghost", "p150", "p1"}, b.loadMany)
	if err != nil || len(got) != 2 || got["p150"].Price != 150 {
		t.Fatalf("mixed GetMany: %v, %v", got, err)
	}
	if last := b.calls[len(b.calls)-1]; len(b.calls) != 2 || !slices.Equal(sorted(last), []string{"ghost", "p150"}) {
		t.Fatalf("batch calls %v: want one more, of ghost and p150 (unknown IDs rejected by the filter)", b.calls)
	}
	c.Counter.Reset()
	if got, err := guard.GetMany(ctx, g, []string{"ghost", "p150"}, b.loadMany); err != nil || len(got) != 1 || c.Counter.RoundTrips() != 1 {
		t.Fatalf("marker and hit: %v, %v, %d round trips", got, err, c.Counter.RoundTrips())
	}
	if _, err := guard.GetMany(ctx, g, []string{"ok", "a\x00"}, b.loadMany); !errors.Is(err, guard.ErrInvalidKey) {
		t.Fatalf("malformed ID: %v", err)
	}
}

// TestGetManyAcrossProcesses: four Guards (as four processes) GetMany the
// same 50 cold IDs at once: each ID is loaded once in all, and no batch
// waits for another (no deadlock between batches holding each other's IDs).
func TestGetManyAcrossProcesses(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	c, g0, d := setup(t, 100, nil)
	d.delay = 20 * time.Millisecond
	var loaded sync.Map // id → loads
	var calls atomic.Int32
	load := func(ctx context.Context, ids []string) (map[string]product, error) {
		calls.Add(1)
		out := map[string]product{}
		for _, id := range ids {
			n, _ := loaded.LoadOrStore(id, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			if p, err := d.load(ctx, id); err == nil {
				out[id] = p
			}
		}
		return out, nil
	}
	guards := []*guard.Guard{g0}
	for range 3 {
		guards = append(guards, otherProcess(t, c))
	}
	var ids []string
	for i := range 50 {
		ids = append(ids, fmt.Sprintf("p%d", i))
	}
	var wg sync.WaitGroup
	for i, g := range guards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := slices.Clone(ids)
			if i%2 == 1 {
				slices.Reverse(mine) // opposite orders: the deadlock-prone case
			}
			got, err := guard.GetMany(ctx, g, mine, load)
			if err != nil || len(got) != 50 {
				t.Errorf("guard %d: %d values, %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()
	n := 0
	loaded.Range(func(id, v any) bool {
		if v.(*atomic.Int32).Load() != 1 {
			t.Errorf("%s loaded %d times", id, v.(*atomic.Int32).Load())
		}
		n++
		return true
	})
	if n != 50 {
		t.Fatalf("%d IDs loaded, want 50", n)
	}
	t.Logf("4 processes × 50 cold IDs: %d batch calls", calls.Load())
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestGetManyLoaderPanic: a panicking batch loader fails the call with
// ErrLoaderPanic instead of taking the process down, releases its locks,
// and the next call works.
func TestGetManyLoaderPanic(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 10, nil)
	boom := func(context.Context, []string) (map[string]product, error) { panic("boom") }
	if _, err := guard.GetMany(ctx, g, []string{"p1", "p2"}, boom); !errors.Is(err, guard.ErrLoaderPanic) {
		t.Fatalf("err = %v, want ErrLoaderPanic", err)
	}
	for _, id := range []string{"p1", "p2"} {
		if n := c.Exists(ctx, c.Prefix+":product:{"+id+"}:lock").Val(); n != 0 {
			t.Fatalf("lock of %s left behind", id)
		}
	}
	b := &batchDB{db: d}
	if got, err := guard.GetMany(ctx, g, []string{"p1", "p2"}, b.loadMany); err != nil || len(got) != 2 {
		t.Fatalf("after the panic: %v, %v", got, err)
	}
}

// TestGetManyWhenRedisIsDown: with Redis gone, GetMany loads the IDs
// through in one batch call (the outage policy), and each ID counts as a
// Get answered by a load; p42, which the filter's copy has never seen, is
// not loaded but answered ErrUnconfirmed.
func TestGetManyWhenRedisIsDown(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, _, g := privateGuard(t, &guard.Options{})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	b := &batchDB{db: newDB(10)}
	before := g.Stats()
	got, err := guard.GetMany(ctx, g, []string{"p1", "p2", "p3", "p42"}, b.loadMany)
	if !errors.Is(err, guard.ErrUnconfirmed) || errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("p42 with Redis down: %v, want ErrUnconfirmed", err)
	}
	if len(got) != 3 || got["p2"].Price != 2 || len(b.calls) != 1 || len(b.calls[0]) != 3 {
		t.Fatalf("values %v, batch calls %v", got, b.calls)
	}
	st := g.Stats()
	if st.LoadThroughs-before.LoadThroughs != 3 || st.Misses-before.Misses != 3 || st.Loads-before.Loads != 3 ||
		st.Unconfirmed-before.Unconfirmed != 1 {
		t.Fatalf("load-throughs %d, misses %d, loads %d, unconfirmed %d: want 3 of each (IDs, as 3 Gets count), 1",
			st.LoadThroughs-before.LoadThroughs, st.Misses-before.Misses, st.Loads-before.Loads, st.Unconfirmed-before.Unconfirmed)
	}
}

// TestGetManyLocal: with Options.Local, GetMany answers what process memory
// holds without Redis, keeps what it reads and loads (a Get finds it
// there too), reads only the rest, and drops a copy when another process
// invalidates it.
func TestGetManyLocal(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	b := &batchDB{db: d}
	other := otherProcess(t, c)
	if _, err := guard.Get(ctx, other, "p3", d.load); err != nil { // p3: in Redis, not in g's memory
		t.Fatal(err)
	}
	flush(t, other) // the Get answered as the load returned; the write follows
	ids := []string{"p1", "p2", "p3"}
	if got, err := guard.GetMany(ctx, g, ids, b.loadMany); err != nil || len(got) != 3 || got["p2"].Price != 2 {
		t.Fatalf("cold GetMany: %v, %v", got, err)
	}
	if len(b.calls) != 1 || !slices.Equal(slices.Sorted(slices.Values(b.calls[0])), []string{"p1", "p2"}) {
		t.Fatalf("batch calls %v, want one for p1 and p2", b.calls)
	}
	c.Counter.Reset()
	before := g.Stats().LocalHits
	got, err := guard.GetMany(ctx, g, ids, b.loadMany)
	if err != nil || len(got) != 3 || got["p3"].Price != 3 {
		t.Fatalf("warm GetMany: %v, %v", got, err)
	}
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 1 {
		t.Fatalf("Get after GetMany: %+v, %v", p, err)
	}
	if n := c.Counter.RoundTrips(); n != 0 {
		t.Fatalf("GetMany and Get from memory cost %d round trips (%v)", n, c.Counter.Names())
	}
	if n := g.Stats().LocalHits - before; n != 4 {
		t.Fatalf("%d local hits, want 4", n)
	}
	// One ID held, one not: only p4 is read (and loaded).
	got, err = guard.GetMany(ctx, g, []string{"p1", "p4"}, b.loadMany)
	if err != nil || len(got) != 2 || got["p4"].Price != 4 {
		t.Fatalf("mixed GetMany: %v, %v", got, err)
	}
	if n := c.Counter.Names()["hget"]; n != 2 { // p4's read and its lock attempt's re-check
		t.Fatalf("%d HGETs for one ID not in memory, want 2 (%v)", n, c.Counter.Names())
	}
	// Another process's write reaches the copy.
	d.set(product{ID: "p2", Name: "new", Price: 20})
	if err := other.Invalidate(ctx, "p2"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the other process's Invalidate reached GetMany's copy", func() bool {
		got, err := guard.GetMany(ctx, g, ids, b.loadMany)
		if err != nil {
			t.Fatal(err)
		}
		return got["p2"].Price == 20
	})
}

// TestGetManyJoinsGetsFlight: a GetMany of an ID whose Get is loading in
// this process joins that Get's flight (one flight group for every entry
// point) instead of waiting on its lock as another process would (the code
// before did: LockWaits 1). The flight started before GetMany, so it does
// not answer it (the started-after rule): GetMany's own flight then finds
// the Get's value, and p1 is loaded once, by the Get.
func TestGetManyJoinsGetsFlight(t *testing.T) {
	ctx := context.Background()
	_, g, d := setup(t, 10, nil)
	started, release := make(chan struct{}), make(chan struct{})
	slow := func(ctx context.Context, id string) (product, error) {
		close(started)
		<-release
		return d.load(ctx, id)
	}
	got := make(chan error, 1)
	go func() {
		_, err := guard.Get(ctx, g, "p1", slow)
		got <- err
	}()
	<-started // the Get's flight holds p1's lock and is loading
	root := redistest.GoID()
	b := &batchDB{db: d}
	many := make(chan map[string]product, 1)
	go func() {
		m, err := guard.GetMany(ctx, g, []string{"p1", "p2"}, b.loadMany)
		if err != nil {
			t.Error(err)
		}
		many <- m
	}()
	// A bound for the failing case alone: the Get's load waits for this test.
	if !redistest.Poll(10*time.Second, func() bool { return joinedFlights(root) == 1 }) { // GetMany's p1 joined the Get's flight
		close(release)
		t.Fatal("GetMany's p1 did not join the Get's flight")
	}
	close(release)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	m := <-many
	if len(m) != 2 || m["p1"].Price != 1 || m["p2"].Price != 2 {
		t.Fatalf("GetMany: %v", m)
	}
	if len(b.calls) != 1 || !slices.Equal(b.calls[0], []string{"p2"}) {
		t.Fatalf("batch calls %v, want one of p2 alone", b.calls)
	}
	if st := g.Stats(); st.LockWaits != 0 || st.Loads != 2 || st.Hits != 1 {
		t.Fatalf("lock waits %d, loads %d, hits %d: want 0, 2 (p1 by the Get, p2 by GetMany) and 1 (GetMany's p1)",
			st.LockWaits, st.Loads, st.Hits)
	}
}
