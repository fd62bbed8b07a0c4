package guard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestRefreshAheadHotKey: 16 goroutines on one key for 3 s, TTL 1 s,
// refreshed from 85% of it (the default), loader 20 ms: after the first Get
// no caller is answered by a load it waited for (every Get is a hit), and
// the loads stay at most 1.2 per TTL. The callers never pause, so with Local
// the refresh runs beside goroutines that never block. (At TTL 500 ms the
// refresh's 75 ms window was missed once under make test's -race run.)
func TestRefreshAheadHotKey(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	for _, local := range []*guard.LocalOptions{nil, {TTL: time.Minute}} {
		name := "redis"
		if local != nil {
			// Local copies live only until the refresh-at time, so the
			// refresh still runs while the key is served from memory.
			name = "local"
		}
		t.Run(name, func(t *testing.T) { refreshAheadHotKey(t, local) })
	}
}

func refreshAheadHotKey(t *testing.T, local *guard.LocalOptions) {
	ctx := context.Background()
	const ttl = time.Second
	_, g, d := setup(t, 10, &guard.Options{TTL: ttl, Jitter: -1, RefreshAhead: true, Local: local})
	d.delay = 20 * time.Millisecond
	if _, err := guard.Get(ctx, g, "p3", d.load); err != nil {
		t.Fatal(err)
	}
	const run = 3 * time.Second
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	var wrong atomic.Int32
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if p, err := guard.Get(ctx, g, "p3", d.load); err != nil || p.Price != 3 {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	st := g.Stats()
	t.Logf(
		"%d Gets in %v: %d from memory, %d answered by a load, %d loads, %d refreshes",
		st.Hits+st.LocalHits+st.Misses,
		run,
		st.LocalHits,
		st.Misses,
		d.calls.Load(),
		st.Refreshes,
	)
	if wrong.Load() != 0 {
		t.Fatalf("%d wrong answers", wrong.Load())
	}
	if local != nil && st.LocalHits == 0 {
		t.Fatalf("no Get was served from memory: %+v", st)
	}
	if st.Misses > 2 { // the first Get; one more at most if a refresh came late on a slow machine
		t.Fatalf("%d Gets waited for a load: refresh-ahead did not keep the key warm (%+v)", st.Misses, st)
	}
	if max := int64(run/ttl)*6/5 + 1; d.calls.Load() > max || st.Refreshes == 0 {
		t.Fatalf("%d loads, %d refreshes in %d TTLs: want at most %d loads", d.calls.Load(), st.Refreshes, run/ttl, max)
	}
}

// TestRefreshAheadNeverServesOverAWrite: with refresh-ahead on and the key
// hot, every Get that starts after an Invalidate or a Set returned gets that
// write's value or a later one: a refresh never brings back older data. The
// TTL (200 ms) puts the refresh-at time 170 ms after each write's fill.
func TestRefreshAheadNeverServesOverAWrite(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	_, g, d := setup(t, 10, &guard.Options{TTL: 200 * time.Millisecond, RefreshAhead: true})
	d.delay = 5 * time.Millisecond
	type read struct {
		start time.Time
		price int
	}
	var mu sync.Mutex
	var reads []read
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				p, err := guard.Get(ctx, g, "p4", d.load)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				reads = append(reads, read{start, p.Price})
				mu.Unlock()
			}
		}()
	}
	type write struct {
		done  time.Time
		price int
	}
	var writes []write
	for i := 1; i <= 15; i++ {
		// A refresh runs between two writes (the readers hit past the
		// refresh-at time, 170ms after the entry's write).
		n := g.Stats().Refreshes
		eventually(t, 10*time.Second, "a refresh", func() bool { return g.Stats().Refreshes > n })
		price := 1000 + i
		d.set(product{ID: "p4", Name: "product p4", Price: price})
		var err error
		if i%2 == 0 {
			err = guard.Set(ctx, g, "p4", product{ID: "p4", Name: "product p4", Price: price})
		} else {
			err = g.Invalidate(ctx, "p4")
		}
		if err != nil {
			t.Fatal(err)
		}
		writes = append(writes, write{time.Now(), price})
	}
	close(done)
	wg.Wait()
	stale := 0
	for _, r := range reads {
		want := 0
		for _, w := range writes {
			if w.done.Before(r.start) {
				want = w.price
			}
		}
		if r.price < want {
			stale++
		}
	}
	if st := g.Stats(); stale != 0 || st.Refreshes == 0 {
		t.Fatalf("%d of %d Gets got a value older than a write that returned before they started (%d refreshes)", stale, len(reads), st.Refreshes)
	}
}

// TestRefreshAheadLoaderPanic: a load that panics during a refresh does not
// take the process down; the value is served until it expires.
func TestRefreshAheadLoaderPanic(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{TTL: time.Minute, Jitter: -1, RefreshAhead: true})
	if _, err := guard.Get(ctx, g, "p5", d.load); err != nil {
		t.Fatal(err)
	}
	refreshDue(t, c, g, "p5")
	panics := func(context.Context, string) (product, error) { panic("boom") }
	if p, err := guard.Get(ctx, g, "p5", panics); err != nil || p.Price != 5 {
		t.Fatalf("the stale value: %+v, %v", p, err)
	}
	waitFor(t, func() bool { return g.Stats().Refreshes == 1 })
	flush(t, g) // the refresh that panicked has ended
	if p, err := guard.Get(ctx, g, "p5", d.load); err != nil || p.Price != 5 {
		t.Fatalf("after the panicked refresh: %+v, %v", p, err)
	}
}

// TestFlushWaitsForRefresh: a Get that serves a value past its refresh-at
// time returns before the reload it started; Flush returns only after the
// reload, and then the new value is in Redis (the next Get calls no loader).
func TestFlushWaitsForRefresh(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, &guard.Options{TTL: time.Minute, Jitter: -1, RefreshAhead: true})
	if _, err := guard.Get(ctx, g, "p3", d.load); err != nil {
		t.Fatal(err)
	}
	flush(t, g)
	refreshDue(t, c, g, "p3")
	d.set(product{ID: "p3", Name: "product p3", Price: 3003})
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the Guard's Close, if the test fails first
	held := func(ctx context.Context, id string) (product, error) {
		<-gate
		return d.load(ctx, id)
	}
	if p, err := guard.Get(ctx, g, "p3", held); err != nil || p.Price != 3 {
		t.Fatalf("the value before its refresh: %+v, %v", p, err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- guard.Flush(ctx, g) }()
	select {
	case err := <-flushed:
		t.Fatalf("Flush returned (%v) while the reload's load was still held", err)
	case <-time.After(50 * time.Millisecond):
	}
	open()
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	calls := d.calls.Load()
	if p, err := guard.Get(ctx, g, "p3", d.load); err != nil || p.Price != 3003 {
		t.Fatalf("after Flush: %+v, %v; want the reloaded price 3003", p, err)
	}
	if n := d.calls.Load() - calls; n != 0 {
		t.Fatalf("the Get after Flush called the loader %d times; the reload should have written the value", n)
	}
}

// refreshDue makes id's entry in Redis due for a refresh now: its frame is
// written again with a refresh-at time of now (the TTL left as it is), so
// that the next hit starts a refresh without waiting 85% of a TTL.
func refreshDue(t *testing.T, c *redistest.Conn, g *guard.Guard, id string) {
	t.Helper()
	ctx := context.Background()
	key := c.Prefix + ":product:{" + id + "}"
	raw, err := c.HGet(ctx, key, guard.Field(g)).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := codec.RefreshAt(raw); !ok {
		t.Fatalf("the entry of %s holds no refresh-at time", id)
	}
	var p product
	if err := codec.Decode(codec.Msgpack, raw, &p); err != nil {
		t.Fatal(err)
	}
	if raw, err = codec.EncodeRefresh(codec.Msgpack, p, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, key, guard.Field(g), raw).Err(); err != nil {
		t.Fatal(err)
	}
}
