package guard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
)

// TestReadLockGivenBack: a read that took the lock and found the entry
// (another process filled it) answers from it and gives the lock back; a
// Get of the same ID after that takes no lock.
func TestReadLockGivenBack(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 20, nil)
	cache(t, g, d, "p1", "p2") // misses: g's reads now take the lock of IDs they have not read
	other := otherProcess(t, c)
	if _, err := guard.Get(ctx, other, "p9", d.load); err != nil { // filled elsewhere
		t.Fatal(err)
	}
	flush(t, other)
	calls := d.calls.Load()
	c.Counter.Reset()
	if p, err := guard.Get(ctx, g, "p9", d.load); err != nil || p.Price != 9 {
		t.Fatalf("Get(p9) = %+v, %v", p, err)
	}
	flush(t, g) // the release follows the answer
	names := c.Counter.Names()
	if d.calls.Load() != calls || names["set"] != 1 || names["evalsha"] != 1 {
		t.Fatalf("%d loads, commands %v: want none, one lock attempt (with the read) and one release", d.calls.Load()-calls, names)
	}
	if n := c.Exists(ctx, keyspace.Lock(c.Prefix+":product:{p9}")).Val(); n != 0 {
		t.Fatal("the lock the read took is still held")
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
// value, and no lock is left behind.
func TestReadLockStampede(t *testing.T) {
	ctx := context.Background()
	c, first, d := setup(t, 100, nil)
	gs := []*guard.Guard{first}
	for range 3 {
		gs = append(gs, otherProcess(t, c))
	}
	for i, g := range gs {
		cache(t, g, d, pid(10+2*i), pid(11+2*i)) // misses: reads take locks
	}
	d.delay = 30 * time.Millisecond
	calls := d.calls.Load()
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
	if n := c.Exists(ctx, keyspace.Lock(c.Prefix+":product:{p50}")).Val(); n != 0 {
		t.Fatal("a lock was left behind")
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
