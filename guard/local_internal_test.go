package guard

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/pubsub"
)

// armedLocal is a local cache with a TTL of ttl, armed without Redis.
func armedLocal(t *testing.T, ttl time.Duration) *local {
	t.Helper()
	l, err := newLocal(LocalOptions{TTL: ttl}, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.c.StopAllGoroutines() })
	l.sub.Store(new(pubsub.Subscription)) // armed, without Redis (never closed: it has no connection)
	return l
}

// TestLocalCopyCountsFromBeforeTheRoundTrip: a copy of an entry whose
// Redis TTL was read (or written) 250 ms after the clock was read before
// its round trip ends when Redis's count would: 300 ms after that clock
// read at the latest, never 300 ms after the put. (Before, put counted the
// TTL from itself: a put delayed after its round trip outlived the entry.)
func TestLocalCopyCountsFromBeforeTheRoundTrip(t *testing.T) {
	l := armedLocal(t, time.Minute)
	since := time.Now().Add(-250 * time.Millisecond)
	l.put("p1", []byte("v"), nil, lifetime{ttl: 300 * time.Millisecond, sent: since}, l.epoch.Load())
	e, st := l.get("p1")
	if st != localFresh {
		t.Fatalf("state %v, want a fresh copy", st)
	}
	if end := since.Add(300 * time.Millisecond); !e.gone || e.end.After(end) {
		t.Fatalf("the copy lives until %v, past its entry's end %v (gone %v)", e.end, end, e.gone)
	}
	l.put("p2", []byte("v"), nil, lifetime{ttl: 300 * time.Millisecond, sent: time.Now().Add(-time.Second)}, l.epoch.Load())
	if _, st := l.get("p2"); st != localNone {
		t.Fatalf("a copy whose entry has already expired was kept (%v)", st)
	}
}

// TestJitterIsWholeMilliseconds: the TTL a write sends Redis (in whole
// ms) is the one a local copy of it counts, so the copy never outlives
// its entry by the fraction Redis drops. It used to count the fraction:
// up to a millisecond past the entry's end.
func TestJitterIsWholeMilliseconds(t *testing.T) {
	const d = 200*time.Millisecond + 456*time.Microsecond
	for _, j := range []float64{0, 0.1, 0.9} {
		g := &Guard{opts: Options{Jitter: j}}
		lo, hi := time.Duration(float64(d)*(1-j)).Truncate(time.Millisecond), time.Duration(float64(d)*(1+j))
		for range 1000 {
			got := g.jitter(d)
			if got%time.Millisecond != 0 || got < lo || got > hi {
				t.Fatalf("jitter %v of %v: %v, want whole milliseconds within [%v, %v]", j, d, got, lo, hi)
			}
		}
	}
	if got := (&Guard{}).jitter(time.Microsecond); got != time.Millisecond {
		t.Fatalf("jitter of 1µs: %v, want the 1 ms minimum", got)
	}
}

// TestLocalRenewsOnlyWhatTheTTLBounds: a copy whose life the local TTL
// bounds is due for renewal in its last fifth; one that dies with its Redis
// entry, or at its refresh-at time, is never due (a read would find the
// same entry), and a fresh one is not due yet.
func TestLocalRenewsOnlyWhatTheTTLBounds(t *testing.T) {
	l := armedLocal(t, time.Second)
	refreshing, err := codec.EncodeRefresh(codec.Msgpack, 1, time.Now().Add(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id       string
		frame    []byte
		redisTTL time.Duration
		dueLeft  time.Duration
	}{
		{"ttl", []byte("v"), time.Minute, time.Second / renewShare}, // or as little as half of it
		{"entry", []byte("v"), 800 * time.Millisecond, 0},
		{"refresh-at", refreshing, time.Minute, 0},
	} {
		l.put(tc.id, tc.frame, nil, lifetime{ttl: tc.redisTTL, sent: time.Now()}, l.epoch.Load())
		f, st := l.get(tc.id)
		if st != localFresh || f.due || f.dueLeft > tc.dueLeft || f.dueLeft < tc.dueLeft/2 {
			t.Fatalf("%s: state %v, due now %v, due with %v left; want fresh, not due now, due with %v left",
				tc.id, st, f.due, f.dueLeft, tc.dueLeft)
		}
	}
}

// TestLocalEpochIsPerKey: a write of one ID stops the reads of that ID in
// flight from keeping their copies, and not those of an ID of another
// stripe (with one epoch for all, it stopped every read in flight); a
// resubscription drops every copy and stops every read in flight.
func TestLocalEpochIsPerKey(t *testing.T) {
	l := armedLocal(t, time.Minute)
	other := "p2"
	for i := 3; l.stripe(other) == l.stripe("p1"); i++ {
		other = fmt.Sprint("p", i)
	}
	put := func(id string, epoch uint64) localState {
		l.put(id, []byte("v"), nil, lifetime{ttl: time.Minute, sent: time.Now()}, epoch)
		_, st := l.get(id)
		return st
	}
	epoch := l.epoch.Load() // the reads of p1 and other start
	l.drop("p1")            // a write of p1 lands
	if st := put("p1", epoch); st != localNone {
		t.Fatal("a read of p1 made before its write kept its copy")
	}
	if st := put(other, epoch); st != localFresh {
		t.Fatalf("a write of p1 stopped a read of %s in flight from keeping its copy", other)
	}
	if st := put("p1", l.epoch.Load()); st != localFresh { // the control: a read after the write keeps its copy
		t.Fatal("a read of p1 made after its write kept no copy")
	}

	epoch = l.epoch.Load()
	l.resubscribed()
	for _, id := range []string{"p1", other} {
		if _, st := l.get(id); st != localNone {
			t.Fatalf("the copy of %s outlived a resubscription", id)
		}
	}
	if st := put("p1", epoch); st != localNone {
		t.Fatal("a read made before a resubscription kept its copy")
	}
	if st := put("p1", l.epoch.Load()); st != localFresh {
		t.Fatal("a read made after a resubscription kept no copy")
	}
}

// LocalEpoch is the count of invalidations g's local cache made or heard.
func LocalEpoch(g *Guard) uint64 { return g.local.epoch.Load() }

// DueNow makes g's copy of id due for renewal (see renew), as if the last
// fifth of its life had come, and reports whether g held one: tests of the
// renewal need not wait for a clock.
func DueNow(g *Guard, id string) bool {
	f, st := g.local.get(id)
	if st != localFresh {
		return false
	}
	e := f.localEntry
	g.local.c.Set(id, &localEntry{frame: e.frame, value: e.value, life: e.life, end: e.end, gone: e.gone, dueLeft: e.life})
	return true
}

// LocalDue reports whether g's copy of id is due for renewal.
func LocalDue(g *Guard, id string) bool {
	f, st := g.local.get(id)
	return st == localFresh && f.due
}

// TestPaceYieldsToWaitingGoroutines: with a goroutine waiting for the one
// processor, pace yields once per yieldPeriod of the caller's stripe, and
// not again within it (the control, which shows the test can tell).
func TestPaceYieldsToWaitingGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	yields := 0
	defer func(y func()) { yield = y }(yield)
	yield = func() { yields++ }
	release := make(chan struct{})
	waiting := make(chan struct{})
	go func() { close(waiting); <-release }() // runnable until it runs: nothing here yields
	defer func() { close(release); <-waiting }()
	var s stripes
	// Every stripe looked last at `at`: the goroutine's stack may move
	// between calls, and its stripe with it.
	lookedAt := func(at int64) {
		for i := range s.s {
			s.s[i].yielded.Store(at)
		}
	}
	now := time.Now().UnixNano()
	for _, c := range []struct {
		last, now int64
		yields    bool
	}{
		{now - yieldPeriod, now, true},
		{now, now + yieldPeriod/2, false},
		{now, now + yieldPeriod, true},
		{now, now - time.Hour.Nanoseconds(), true}, // the clock went back
	} {
		lookedAt(c.last)
		before := yields
		s.pace(c.now)
		if got := yields > before; got != c.yields {
			t.Errorf("last look %d ns before, yielded %v, want %v", c.now-c.last, got, c.yields)
		}
	}
}
