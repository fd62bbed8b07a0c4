package guard_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// holdReads is a redis.Hook that, once armed, holds every read sent alone
// (a single HGET) until release is closed, and counts them.
type holdReads struct {
	mu      sync.Mutex // guards armed and held
	armed   bool
	held    int
	release chan struct{}
}

func (h *holdReads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		hold := h.armed && cmd.Name() == "hget"
		if hold {
			h.held++
		}
		h.mu.Unlock()
		if hold {
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *holdReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *holdReads) setArmed(on bool) {
	h.mu.Lock()
	h.armed = on
	h.mu.Unlock()
}

// warmThenHold caches p0..p(n-1), pays back the miss credit (payCredit) and
// holds the reads of rdb (g's client) from then on.
func warmThenHold(t *testing.T, rdb redis.UniversalClient, g *guard.Guard, d *db, n int) *holdReads {
	t.Helper()
	for i := range n {
		if _, err := guard.Get(context.Background(), g, pid(i), d.load); err != nil {
			t.Fatal(err)
		}
	}
	payCredit(t, g, d)
	h := &holdReads{release: make(chan struct{})}
	rdb.AddHook(h)
	h.setArmed(true)
	return h
}

func (h *holdReads) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

func pid(i int) string { return "p" + strconv.Itoa(i) }

// payCredit makes enough hits on p0 that the reads after it send the HGET
// alone (the miss credit is at most 1024: see read).
func payCredit(t *testing.T, g *guard.Guard, d *db) {
	t.Helper()
	for range 1100 {
		if _, err := guard.Get(context.Background(), g, "p0", d.load); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadsShareRoundTrips: while readsInFlight (2) reads are under way,
// the Gets that come wait, and all of them go in the next round trip: one
// pipeline, one HGET each, every caller answered with its own value.
// A Get whose ctx ends meanwhile leaves at once, and its read is not sent.
func TestReadsShareRoundTrips(t *testing.T) {
	clusterToo(t)
	root := redistest.GoID() // the reads below are its goroutines
	ctx := context.Background()
	c, g, d := setup(t, 60, nil)
	h := warmThenHold(t, c, g, d, 60)
	loads := d.calls.Load()
	c.Counter.Reset()

	type answer struct {
		p   product
		err error
	}
	answers := make([]chan answer, 52)
	get := func(i int) {
		answers[i] = make(chan answer, 1)
		go func() {
			p, err := guard.Get(ctx, g, pid(i), d.load)
			answers[i] <- answer{p, err}
		}()
	}
	get(0)
	get(1)
	waitFor(t, func() bool { return h.count() == 2 })
	for i := 2; i < 52; i++ {
		get(i)
	}
	// One more, whose ctx ends while it waits. With this test's client
	// (ContextTimeoutEnabled off) its read gets half its time, and it
	// loads through with the rest (see sendRead); either way it leaves.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	p, err := guard.Get(short, g, "p55", d.load)
	throughLoads := int64(0)
	switch {
	case err == nil && p.ID == "p55":
		throughLoads = 1
	case !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("a Get whose ctx ended while its read waited: %+v, %v; want its load-through or context.DeadlineExceeded", p, err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("it returned after %v: a waiting read must leave with its ctx", waited)
	}
	waitFor(t, func() bool { return readsWaiting(root) == 50 })
	h.setArmed(false)
	close(h.release)
	for i, ch := range answers {
		a := <-ch
		if a.err != nil {
			t.Fatalf("Get %d: %v", i, a.err)
		}
		if a.p.ID != pid(i) || a.p.Price != i {
			t.Fatalf("Get %d answered %+v", i, a.p)
		}
	}
	trips, hgets := c.Counter.RoundTrips(), c.Counter.Names()["hget"]
	t.Logf("52 hits while 2 reads were held: %d HGETs in %d round trips", hgets, trips)
	if hgets != 52 || trips != 3 {
		t.Fatalf("%d HGETs in %d round trips, want 52 in 3: the two held, then the fifty that waited together (and not the read that left)", hgets, trips)
	}
	if n := d.calls.Load(); n != loads+throughLoads {
		t.Fatalf("loader called %d times during the hits, want %d (the load-through)", n-loads, throughLoads)
	}
}

// TestReadBatchingOff: with read batching off (a test's Guard alone),
// concurrent Gets each send their own read: the control of the batching.
func TestReadBatchingOff(t *testing.T) {
	ctx := context.Background()
	c, g, d := setup(t, 10, nil)
	guard.SetReadsInFlight(g, -1)
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	payCredit(t, g, d)
	c.Counter.Reset()
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if trips, hgets := c.Counter.RoundTrips(), c.Counter.Names()["hget"]; trips != 200 || hgets != 200 {
		t.Fatalf("%d HGETs in %d round trips, want 200 in 200", hgets, trips)
	}
}

// TestSharedRoundTripFails: when the round trip that carries several Gets'
// reads fails, each of them gets ErrUnavailable (and loads through), never
// ErrNotFound.
func TestSharedRoundTripFails(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	// The reads below are its goroutines.
	root := redistest.GoID()
	ctx := context.Background()
	srv, rdb, g := privateGuard(t, &guard.Options{Outage: &guard.OutageOptions{FailFast: true}})
	guard.SetReadsInFlight(g, 1)
	d := newDB(10)
	h := warmThenHold(t, rdb, g, d, 10)
	errs := make(chan error, 10)
	go func() { _, err := guard.Get(ctx, g, "p0", d.load); errs <- err }()
	waitFor(t, func() bool { return h.count() == 1 })
	for i := 1; i < 10; i++ {
		go func() { _, err := guard.Get(ctx, g, pid(i), d.load); errs <- err }()
	}
	waitFor(t, func() bool { return readsWaiting(root) == 9 })
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	h.setArmed(false)
	close(h.release)
	for range 10 {
		err := <-errs
		var ne net.Error
		if errors.Is(err, guard.ErrNotFound) || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("a read in a failed round trip: %v (net error: %v), want ErrUnavailable", err, errors.As(err, &ne))
		}
	}
}

// TestCancelledCallerIsNotARedisFailure: a Get whose ctx was cancelled (its
// client left) gets context.Canceled; it is not counted as Redis failing,
// so client disconnects cannot open the breaker.
func TestCancelledCallerIsNotARedisFailure(t *testing.T) {
	_, g, d := setup(t, 10, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 50 {
		if _, err := guard.Get(ctx, g, "p1", d.load); !errors.Is(err, context.Canceled) || errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("Get on a cancelled ctx: %v, want context.Canceled alone", err)
		}
	}
	if st := g.Stats(); st.RedisErrors != 0 || st.BreakerOpens != 0 || st.LoadThroughs != 0 {
		t.Fatalf("stats %+v: a cancelled caller counted as a Redis failure", st)
	}
}

// TestSameKeyReadsShareOneHGET: the Gets of one key that wait for a round
// trip together share one HGET, and the rule of join holds: a Set returns
// while the first of them wait, the rest start after it, and every one of
// them answers the new value (their one read is sent after all started).
func TestSameKeyReadsShareOneHGET(t *testing.T) {
	clusterToo(t)
	root := redistest.GoID() // the reads below are its goroutines
	ctx := context.Background()
	c, g, d := setup(t, 10, nil)
	h := warmThenHold(t, c, g, d, 10)
	c.Counter.Reset()
	answers := make(chan product, 60)
	get := func(id string) {
		go func() {
			p, err := guard.Get(ctx, g, id, d.load)
			if err != nil {
				t.Error(err)
			}
			answers <- p
		}()
	}
	get("p0")
	get("p1")
	waitFor(t, func() bool { return h.count() == 2 })
	for range 20 {
		get("p5")
		get("p6")
	}
	waitFor(t, func() bool { return readsWaiting(root) == 40 })
	updated := product{ID: "p5", Name: "updated", Price: 505}
	d.set(updated)
	if err := guard.Set(ctx, g, "p5", updated); err != nil {
		t.Fatal(err)
	}
	for range 18 {
		get("p5")
	}
	waitFor(t, func() bool { return readsWaiting(root) == 58 })
	h.setArmed(false)
	close(h.release)
	for range 60 {
		if p := <-answers; (p.ID == "p5" && p != updated) || (p.ID != "p5" && p.Price != int(p.ID[1]-'0')) {
			t.Fatalf("answered %+v", p)
		}
	}
	if hgets := c.Counter.Names()["hget"]; hgets != 4 { // the two held, then one for p5's 38 and one for p6's 20
		t.Fatalf("%d HGETs for 60 Gets of 4 keys, want 4: the waiting reads of one key share one", hgets)
	}
}
