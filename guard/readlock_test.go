package guard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestReadLockGivenBack: a read that took the lock and found the entry
// (another process filled it) answers from it and gives the lock back
// before the Get returns, so that a process may exit then (the release is
// held 100 ms in a hook: given back in the background, as it once was, the
// lock is still there when the Get returns); a Get of the same ID after that
// takes no lock.
func TestReadLockGivenBack(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, d := setup(t, 20, nil)
	h := hooked(c)
	slowRelease := func(cmd redis.Cmder) {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			time.Sleep(100 * time.Millisecond) // the release's round trip, made slow
		}
	}
	cache(t, g, d, "p1", "p2") // misses: g's reads now take the lock of IDs they have not read
	other := otherProcess(t, c)
	if _, err := guard.Get(ctx, other, "p9", d.load); err != nil { // filled elsewhere
		t.Fatal(err)
	}
	flush(t, other)
	calls := d.calls.Load()
	c.Counter.Reset()
	h.sending.Store(&slowRelease)
	p, err := guard.Get(ctx, g, "p9", d.load)
	h.sending.Store(nil)
	if err != nil || p.Price != 9 {
		t.Fatalf("Get(p9) = %+v, %v", p, err)
	}
	if n := c.Exists(ctx, keyspace.Lock(c.Prefix+":product:{p9}")).Val(); n != 0 {
		t.Fatal("the Get returned before it gave back the lock its read took")
	}
	names := c.Counter.Names()
	if d.calls.Load() != calls || names["set"] != 1 || names["evalsha"] != 1 {
		t.Fatalf("%d loads, commands %v: want none, one lock attempt (with the read) and one release", d.calls.Load()-calls, names)
	}
	c.Counter.Reset()
	if _, err := guard.Get(ctx, g, "p9", d.load); err != nil {
		t.Fatal(err)
	}
	if n := c.Counter.Names()["set"]; n != 0 || c.Counter.RoundTrips() != 1 {
		t.Fatalf("a hit on an ID this process read: commands %v, %d round trips; want one, no lock", c.Counter.Names(), c.Counter.RoundTrips())
	}
}

// TestReadLockStampede: processes whose reads take the lock (their gates
// open) stampede on one cold ID: one load in all, every caller gets the
// value, and no lock is left behind. With the in-process cache too: a
// process's callers share one read there, and the lock it took goes to
// its first caller's flight.
func TestReadLockStampede(t *testing.T) {
	clusterToo(t)
	for _, tc := range []struct {
		name  string
		local *guard.LocalOptions
	}{{"default", nil}, {"local", &guard.LocalOptions{TTL: time.Minute}}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c, first, d := setup(t, 100, &guard.Options{Local: tc.local})
			gs := []*guard.Guard{first}
			for range 3 {
				g, err := guard.New(
					ctx,
					redistest.Connect(t),
					"product",
					&guard.Options{KeyPrefix: c.Prefix, Local: tc.local, Filter: guard.FilterOptions{ExpectedItems: 10_000}},
				)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = g.Close() })
				gs = append(gs, g)
			}
			for i, g := range gs {
				cache(t, g, d, pid(10+2*i), pid(11+2*i)) // misses: reads take locks
			}
			d.delay = 30 * time.Millisecond
			calls := d.calls.Load()
			c.Counter.Reset()
			var wg sync.WaitGroup
			for _, g := range gs {
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if p, err := guard.Get(ctx, g, "p50", d.load); err != nil || p.Price != 50 {
							t.Errorf("Get(p50) = %+v, %v", p, err)
						}
					}()
				}
			}
			wg.Wait()
			for _, g := range gs {
				flush(t, g)
			}
			if n := d.calls.Load() - calls; n != 1 {
				t.Fatalf("%d loads of p50 across 4 processes, want 1", n)
			}
			if n := c.Counter.Names()["set"]; n == 0 {
				t.Fatal("no lock attempt: the reads' gates were closed, the test tests nothing")
			}
			if n := c.Exists(ctx, keyspace.Lock(c.Prefix+":product:{p50}")).Val(); n != 0 {
				t.Fatal("a lock was left behind")
			}
		})
	}
}

// TestReadLockLapsesAfterPeek: a Peek whose Get never comes leaves the lock
// its read took for a short lease only; another process's Get then loads
// as usual, once.
func TestReadLockLapsesAfterPeek(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 20, nil)
	cache(t, g, d, "p1", "p2") // misses: g's reads now take the lock of IDs they have not read
	if _, ok, err := g.Peek(ctx, "p7"); err != nil || !ok {
		t.Fatalf("Peek(p7) = %v, %v", ok, err)
	}
	lk := keyspace.Lock(c.Prefix + ":product:{p7}")
	if left := c.PTTL(ctx, lk).Val(); left <= 0 || left > time.Second {
		t.Fatalf("the lock Peek's read took has %v left, want a short lease", left)
	}
	calls := d.calls.Load()
	if p, err := guard.Get(ctx, otherProcess(t, c), "p7", d.load); err != nil || p.Price != 7 {
		t.Fatalf("Get(p7) elsewhere = %+v, %v", p, err)
	}
	if n := d.calls.Load() - calls; n != 1 {
		t.Fatalf("%d loads, want 1", n)
	}
}

// TestReadLockHolderJoinsAWaitingFlight: a Get whose read took the lock
// (here a Peek's) can find a flight of its process already under way,
// started by a Get whose read took none, and waiting for that very lock.
// It gives the lock back as it joins, which wakes the flight: one load,
// no wait for the lock's lease.
func TestReadLockHolderJoinsAWaitingFlight(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 100, nil)
	cache(t, g, d, "p1", "p2")          // misses: g's reads now take the lock of IDs they have not read
	pctx, ok, err := g.Peek(ctx, "p60") // takes p60's lock with its read
	if err != nil || !ok {
		t.Fatalf("Peek(p60) = %v, %v", ok, err)
	}
	before := g.Stats()
	calls := d.calls.Load()
	errs := make(chan error, 2)
	go func() { _, err := guard.Get(ctx, g, "p60", d.load); errs <- err }() // no lock with its read (p60 was read): a flight that waits
	waiting := keyspace.Waiting(c.Prefix + ":product:{p60}")
	waitFor(t, func() bool { return c.Exists(ctx, waiting).Val() == 1 })
	go func() { _, err := guard.Get(pctx, g, "p60", d.load); errs <- err }() // holds the lock, joins that flight
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := g.Stats()
	if n := d.calls.Load() - calls; n != 1 || st.LockWaits-before.LockWaits != 1 || st.Wakeups-before.Wakeups != 1 {
		t.Fatalf("%d loads, %d waits, %d wake-ups: want 1, 1 and 1 (the lock given back woke the flight)",
			n, st.LockWaits-before.LockWaits, st.Wakeups-before.Wakeups)
	}
}

// TestReadLockGateClosesInAFleet: in a fleet whose other processes have
// filled what this one reads for the first time, its reads' locks find
// the entries there and go unused; the gate closes after the first, and
// the reads go on without locks.
func TestReadLockGateClosesInAFleet(t *testing.T) {
	t.Parallel() // its own keys, no process-wide state: runs beside the others
	ctx := context.Background()
	c, g, d := setup(t, 300, nil)
	other := otherProcess(t, c)
	ids := make([]string, 0, 200)
	for i := 100; i < 300; i++ {
		ids = append(ids, pid(i))
	}
	cache(t, other, d, ids...)                             // filled elsewhere
	cache(t, g, d, "p1", "p2")                             // this process's own misses open its gate
	sets := func() int { return c.Counter.Names()["set"] } // this process's lock attempts
	c.Counter.Reset()
	for _, id := range ids {
		if _, err := guard.Get(ctx, g, id, d.load); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, g)
	if n := sets(); n == 0 || n > 2 {
		t.Fatalf("%d reads of entries filled elsewhere took %d locks, want 1 or 2 before the gate closed", len(ids), n)
	}
}

// TestReadLockWithLocal: a Guard with the in-process cache takes the lock
// with the read too. Once reads have missed, a miss of an ID this process
// has not read costs two round trips (read with the lock, the entry's PTTL
// and the probe; write + release), no lock is left behind, and the value
// then serves from memory with no round trip.
func TestReadLockWithLocal(t *testing.T) {
	ctx := context.Background()
	warmScripts(t)
	c, g, d := setup(t, 20, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	cache(t, g, d, "p1", "p2") // misses: g's reads now take the lock of IDs they have not read
	c.Counter.Reset()
	if p, err := guard.Get(ctx, g, "p9", d.load); err != nil || p.Price != 9 {
		t.Fatalf("Get(p9) = %+v, %v", p, err)
	}
	flush(t, g)
	names := c.Counter.Names()
	t.Logf("miss with Local: %d round trips, commands %v", c.Counter.RoundTrips(), names)
	if n := c.Counter.RoundTrips(); n != 2 || names["set"] != 1 || names["pttl"] != 1 {
		t.Fatalf("miss with Local: %d round trips, commands %v; want 2, the lock attempt and the PTTL with the read", n, names)
	}
	calls := d.calls.Load()
	c.Counter.Reset()
	for range 10 {
		if p, err := guard.Get(ctx, g, "p9", d.load); err != nil || p.Price != 9 {
			t.Fatalf("Get(p9) again = %+v, %v", p, err)
		}
	}
	if n := c.Counter.RoundTrips(); n != 0 || d.calls.Load() != calls {
		t.Fatalf("10 local hits: %d round trips, %d loads; want none", n, d.calls.Load()-calls)
	}
}
