package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// parked is a job of the Guard's held in the application's code until
// Close has begun (it sees its ctx cancelled) and the test lets it go.
type parked struct {
	entered, in, proceed chan struct{}
	ended                error // the job's ctx's error, read after in is closed
}

func newParked() *parked {
	return &parked{entered: make(chan struct{}), in: make(chan struct{}), proceed: make(chan struct{})}
}

// hold blocks the job until its ctx is cancelled (Close began), then until
// the test lets it go.
func (p *parked) hold(ctx context.Context) {
	close(p.entered)
	<-ctx.Done()
	p.ended = ctx.Err()
	close(p.in)
	<-p.proceed
}

// closeWaits closes g while p holds one of its jobs, and checks that Close
// returns only after the job has ended and that no goroutine the Guard
// started is left (before: goroutines that ran before New).
func closeWaits(t *testing.T, g *guard.Guard, p *parked, before goleak.Option) {
	t.Helper()
	<-p.entered
	closed := make(chan struct{})
	go func() { _ = g.Close(); close(closed) }()
	<-p.in // Close has cancelled the job's ctx
	select {
	case <-closed:
		t.Fatal("Close returned while a job of the Guard still ran")
	default:
	}
	close(p.proceed)
	<-closed
	noneLeft(t, before)
}

// noneLeft fails if a goroutine started after before is still there.
func noneLeft(t *testing.T, before goleak.Option) {
	t.Helper()
	if err := goleak.Find(before,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err != nil {
		t.Fatalf("goroutines left after Close: %v", err)
	}
}

// TestCloseWaitsForEveryJob: Close cancels and waits for each kind of
// background job the Guard runs: a refresh ahead, an automatic rebuild,
// a load past LoadTimeout, the replay of a failed write, connecting after
// a New without Redis, and the local cache's invalidation subscription.
func TestCloseWaitsForEveryJob(t *testing.T) {
	ctx := context.Background()
	t.Run("refresh", func(t *testing.T) {
		c := redistest.Connect(t)
		before := goleak.IgnoreCurrent()
		p := newParked()
		g := openRebuilt(t, c, guard.Options{KeyPrefix: c.Prefix, TTL: time.Minute, RefreshAhead: true}, 1000, 10)
		loads := 0
		load := func(ctx context.Context, id string) (product, error) {
			if loads++; loads > 1 { // the refresh (flights of one ID run one at a time)
				p.hold(ctx)
			}
			return product{ID: id}, nil
		}
		if _, err := guard.Get(ctx, g, "p1", load); err != nil { // the miss
			t.Fatal(err)
		}
		flush(t, g)
		refreshDue(t, c, g, "p1")
		if _, err := guard.Get(ctx, g, "p1", load); err != nil { // past its refresh-at time: starts the refresh
			t.Fatal(err)
		}
		closeWaits(t, g, p, before)
		if !errors.Is(p.ended, context.Canceled) { // not its LoadTimeout
			t.Fatalf("the refresh's load ended with %v; want Close to cancel it", p.ended)
		}
	})
	t.Run("rebuild", func(t *testing.T) {
		c := redistest.Connect(t)
		before := goleak.IgnoreCurrent()
		p := newParked()
		src := func(ctx context.Context) iter.Seq2[string, error] {
			return func(yield func(string, error) bool) {
				p.hold(ctx)
				yield("", ctx.Err())
			}
		}
		g, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000, IDs: src}})
		if err != nil {
			t.Fatal(err)
		}
		closeWaits(t, g, p, before)
	})
	t.Run("abandoned load", func(t *testing.T) {
		c := redistest.Connect(t)
		before := goleak.IgnoreCurrent()
		p := newParked()
		g := openRebuilt(t, c, guard.Options{KeyPrefix: c.Prefix, LoadTimeout: time.Millisecond}, 1000, 10)
		load := func(context.Context, string) (product, error) {
			close(p.entered)
			<-p.proceed // ignores its ctx, past LoadTimeout: the Get gives up on it
			return product{}, nil
		}
		if _, err := guard.Get(ctx, g, "p1", load); err == nil {
			t.Fatal("a load past LoadTimeout answered")
		}
		closed := make(chan struct{})
		go func() { _ = g.Close(); close(closed) }()
		// Nothing tells the load that Close began (its ctx ended before):
		// a Close that did not wait for it returns in microseconds.
		select {
		case <-closed:
			t.Fatal("Close returned while the abandoned load ran")
		case <-time.After(100 * time.Millisecond):
		}
		close(p.proceed)
		<-closed
		noneLeft(t, before)
	})
	t.Run("replay, connect, local", func(t *testing.T) {
		srv, rdb := redistest.Private(t)
		before := goleak.IgnoreCurrent()
		g, err := guard.New(ctx, rdb, "product", &guard.Options{Local: &guard.LocalOptions{}, Filter: guard.FilterOptions{ExpectedItems: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := g.Invalidate(ctx, "p1"); err == nil { // its replay starts
			t.Fatal("Invalidate with Redis down returned nil")
		}
		g2, err := guard.New(ctx, rdb, "other", nil) // Redis down: connects later
		if err != nil {
			t.Fatal(err)
		}
		if g.Stats().Unwritten != 1 {
			t.Fatalf("Unwritten = %d, want 1", g.Stats().Unwritten)
		}
		if err := g.Close(); err != nil {
			t.Logf("Close: %v", err)
		}
		_ = g2.Close()
		noneLeft(t, before)
	})
}

// TestCloseDisarmsTheReadAlarm: on a client without ContextTimeoutEnabled
// (redistest's), a Get under a deadline waits for its read until half its
// time, on the read batcher's shared alarm, which an answered Get leaves
// armed; Close disarms it, so nothing of the Guard's runs at that time.
// Control: the first Get's alarm, stopped here, was armed.
func TestCloseDisarmsTheReadAlarm(t *testing.T) {
	c := redistest.Connect(t)
	g := openRebuilt(t, c, guard.Options{KeyPrefix: c.Prefix}, 1000, 10)
	get := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		if _, err := guard.Get(ctx, g, "p1", func(context.Context, string) (product, error) { return product{ID: "p1"}, nil }); err != nil {
			t.Fatal(err)
		}
	}
	get()
	if !guard.StopReadAlarm(g) {
		t.Fatal("a Get under a deadline left no alarm armed: the test checks nothing")
	}
	get()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if guard.StopReadAlarm(g) {
		t.Fatal("the read alarm was still armed after Close")
	}
}

// TestCallInsideCloseStillLoads: a Get that entered before Close, whose
// flight reaches its load only after Close began, loads and answers: Close
// waits for the calls inside and for what they start (the load's
// goroutine), and refuses only the calls that come after.
func TestCallInsideCloseStillLoads(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	h := hooked(c)
	g := openRebuilt(t, c, guard.Options{KeyPrefix: c.Prefix}, 1000, 10)
	vkey := c.Prefix + ":product:{p1}"
	reading, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func(cmd redis.Cmder) { // the Get's read of p1, held until Close has begun
		if a := cmd.Args(); cmd.Name() == "hget" && len(a) > 1 && a[1] == vkey {
			once.Do(func() { close(reading); <-release })
		}
	}
	h.sending.Store(&hold)
	defer h.sending.Store(nil)
	got := make(chan error, 1)
	go func() {
		p, err := guard.Get(ctx, g, "p1", func(context.Context, string) (product, error) { return product{ID: "p1", Price: 1}, nil })
		if err == nil && p.Price != 1 {
			err = fmt.Errorf("got %+v", p)
		}
		got <- err
	}()
	<-reading
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	redistest.WaitParked(t, 1, "guard.(*gate).close", "") // Close waits for the Get
	if _, err := guard.Get(ctx, g, "p2", func(context.Context, string) (product, error) { return product{}, nil }); !errors.Is(err, guard.ErrClosed) {
		t.Fatalf("a Get after Close began: %v, want ErrClosed", err)
	}
	close(release)
	if err := <-got; err != nil {
		t.Fatalf("the Get inside Close: %v; want its load's value", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
