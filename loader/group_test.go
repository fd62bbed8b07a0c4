package loader_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
)

// TestMain checks that no goroutine outlives the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

func TestOneFlightManyCallers(t *testing.T) {
	var g loader.Group[string, int]
	var calls atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]int, 100)
	joined := make(chan struct{}, len(results))
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			v, _, err := g.DoOnJoin(ctx, "k", func(context.Context) (int, error) {
				calls.Add(1)
				<-release
				return 7, nil
			}, func() { joined <- struct{}{} })
			if err != nil {
				t.Error(err)
			}
			results[i] = v
		}()
	}
	for range len(results) - 1 {
		<-joined // the rest joined the flight
	}
	close(release)
	wg.Wait()
	if calls.Load() != 1 {
		t.Fatalf("fn ran %d times, want 1", calls.Load())
	}
	for i, v := range results {
		if v != 7 {
			t.Fatalf("caller %d got %d", i, v)
		}
	}
}

func TestPanicBecomesErrorForEveryCaller(t *testing.T) {
	var g loader.Group[string, int]
	start := make(chan struct{})
	var wg sync.WaitGroup
	var errs atomic.Int32
	arrived := make(chan struct{}, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, _, err := g.DoOnJoin(ctx, "k", func(context.Context) (int, error) {
				arrived <- struct{}{}
				<-start
				panic("boom")
			}, func() { arrived <- struct{}{} })
			if errors.Is(err, loader.ErrPanic) {
				errs.Add(1)
			}
		}()
	}
	for range 50 {
		<-arrived // each caller runs the flight or joined it
	}
	close(start)
	wg.Wait()
	if errs.Load() != 50 {
		t.Fatalf("%d of 50 callers got ErrPanic", errs.Load())
	}
	// Uncancellable ctx takes the other path; same outcome.
	if _, _, err := g.Do(context.Background(), "k2", func(context.Context) (int, error) { panic("x") }); !errors.Is(err, loader.ErrPanic) {
		t.Fatalf("err = %v", err)
	}
}

func TestCallerLeavesOnItsOwnCtxFlightContinues(t *testing.T) {
	g := loader.Group[string, string]{Timeout: 5 * time.Second}
	release := make(chan struct{})
	var sawCancel atomic.Bool
	started := make(chan struct{})
	var once sync.Once
	fn := func(ctx context.Context) (string, error) {
		once.Do(func() { close(started) })
		select {
		case <-release:
			return "v", nil
		case <-ctx.Done():
			sawCancel.Store(true)
			return "", ctx.Err()
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	patient := make(chan string)
	joined := make(chan struct{})
	go func() {
		<-started // the impatient caller's flight runs: this one joins it
		v, _, err := g.DoOnJoin(context.Background(), "k", fn, func() { close(joined) })
		if err != nil {
			t.Error(err)
		}
		patient <- v
	}()
	if _, _, err := g.Do(short, "k", fn); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("impatient caller: err = %v, want DeadlineExceeded", err)
	}
	<-joined
	close(release)
	if v := <-patient; v != "v" {
		t.Fatalf("patient caller got %q", v)
	}
	if sawCancel.Load() {
		t.Fatal("the first caller's deadline reached the flight")
	}
}

func TestTimeoutBoundsFlight(t *testing.T) {
	g := loader.Group[string, int]{Timeout: 20 * time.Millisecond}
	_, _, err := g.Do(context.Background(), "k", func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// TestDoOnJoin: onJoin runs for each caller that joins the flight
// under way, before it waits (here the flight waits for every joiner's
// onJoin, as a flight may wait for a lock a joiner holds), and never for
// the caller that starts the flight.
func TestDoOnJoin(t *testing.T) {
	var g loader.Group[string, int]
	const joiners = 5
	var joined sync.WaitGroup
	joined.Add(joiners)
	started := make(chan struct{})
	var starterJoined atomic.Bool
	results := make(chan int, joiners+1)
	go func() {
		v, _, err := g.DoOnJoin(context.Background(), "k", func(context.Context) (int, error) {
			close(started)
			joined.Wait() // would never end if a joiner waited before its onJoin
			return 7, nil
		}, func() { starterJoined.Store(true) })
		if err != nil {
			t.Error(err)
		}
		results <- v
	}()
	<-started
	for range joiners {
		go func() {
			v, _, err := g.DoOnJoin(context.Background(), "k", func(context.Context) (int, error) {
				t.Error("a joiner's function ran")
				return 0, nil
			}, joined.Done)
			if err != nil {
				t.Error(err)
			}
			results <- v
		}()
	}
	for range joiners + 1 {
		if v := <-results; v != 7 {
			t.Fatalf("got %d, want the flight's 7", v)
		}
	}
	if starterJoined.Load() {
		t.Fatal("onJoin ran for the caller that started the flight")
	}
}

// TestSpawnStartsTheFlight: with Spawn set, the flight's goroutine is
// started through it (its owner can wait for it), and the callers get the
// flight's result as before.
func TestSpawnStartsTheFlight(t *testing.T) {
	var spawned atomic.Int32
	var wg sync.WaitGroup
	g := loader.Group[string, int]{Spawn: func(run func()) {
		spawned.Add(1)
		wg.Go(run)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v, _, err := g.Do(ctx, "k", func(context.Context) (int, error) { return 7, nil })
	wg.Wait() // the owner waits for the flight's goroutine
	if err != nil || v != 7 || spawned.Load() != 1 {
		t.Fatalf("Do = %d, %v with %d goroutines spawned, want 7, nil and 1", v, err, spawned.Load())
	}
}

// TestGo: Go starts a flight nobody waits for, once per key while it runs;
// a Do that arrives meanwhile joins it (shared), and once it ended the next
// Go starts another. A panic in it reaches nobody and crashes nothing.
func TestGo(t *testing.T) {
	var g loader.Group[string, int]
	release := make(chan struct{})
	ran := make(chan int, 4)
	fn := func(n int) func(context.Context) (int, error) {
		return func(context.Context) (int, error) {
			<-release
			ran <- n
			return n, nil
		}
	}
	if !g.Go(context.Background(), "k", fn(1)) {
		t.Fatal("Go did not start a flight")
	}
	if g.Go(context.Background(), "k", fn(2)) {
		t.Fatal("a second Go started a flight while the first ran")
	}
	got := make(chan int, 1)
	joined := make(chan struct{})
	go func() {
		v, shared, err := g.DoOnJoin(context.Background(), "k", fn(3), func() { close(joined) })
		if err != nil || !shared {
			t.Errorf("Do after Go: %v, shared %v; want the Go's flight, shared", err, shared)
		}
		got <- v
	}()
	<-joined
	close(release)
	if v := <-got; v != 1 {
		t.Fatalf("Do joined and got %d, want the Go's 1", v)
	}
	if n := <-ran; n != 1 {
		t.Fatalf("flight %d ran, want 1", n)
	}
	done := make(chan struct{})
	if !g.Go(context.Background(), "k", func(context.Context) (int, error) { defer close(done); panic("boom") }) {
		t.Fatal("Go did not start a flight once the first had answered")
	}
	<-done
	if len(ran) != 0 {
		t.Fatalf("%d more flights ran", len(ran))
	}
}

// inCaller drives a Group that runs flights InCaller: fn counts its runs,
// says it started and returns what release sends (or its ctx's error).
type inCaller struct {
	g       loader.Group[string, int]
	runs    atomic.Int32
	started chan struct{}
	release chan int
	joins   chan struct{}
}

func newInCaller() *inCaller {
	r := &inCaller{started: make(chan struct{}, 4), release: make(chan int, 4), joins: make(chan struct{}, 8)}
	r.g.InCaller = true
	return r
}

func (r *inCaller) fn(ctx context.Context) (int, error) {
	r.runs.Add(1)
	r.started <- struct{}{}
	select {
	case v := <-r.release:
		return v, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// do calls the Group for key "k" in a goroutine and returns its answer.
func (r *inCaller) do(ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, _, err := r.g.DoOnJoin(ctx, "k", r.fn, func() { r.joins <- struct{}{} })
		errc <- err
	}()
	return errc
}

// TestInCallerShares: callers that arrive while an InCaller flight runs
// get its result (one run), which ran in the first caller's goroutine on
// its own ctx (not a detached one).
func TestInCallerShares(t *testing.T) {
	r := newInCaller()
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "mine"))
	defer cancel()
	var sameCtx atomic.Bool
	first := make(chan int, 1)
	go func() {
		v, _, _ := r.g.Do(ctx, "k", func(fctx context.Context) (int, error) {
			sameCtx.Store(fctx == ctx)
			return r.fn(fctx)
		})
		first <- v
	}()
	<-r.started
	errs := []<-chan error{r.do(context.Background()), r.do(context.Background())}
	<-r.joins
	<-r.joins
	r.release <- 7
	for _, e := range errs {
		if err := <-e; err != nil {
			t.Fatal(err)
		}
	}
	if v := <-first; v != 7 || r.runs.Load() != 1 || !sameCtx.Load() {
		t.Fatalf("first caller %d after %d runs (its own ctx: %v); want 7 after 1, on its ctx", v, r.runs.Load(), sameCtx.Load())
	}
}

// TestInCallerLeaderGivesUp: when the caller running the flight gives up
// (its ctx ends), the callers waiting for it run it again instead of
// taking its error; a waiter whose own ctx ends leaves at once.
func TestInCallerLeaderGivesUp(t *testing.T) {
	r := newInCaller()
	ctx, cancel := context.WithCancel(context.Background())
	first := r.do(ctx)
	<-r.started
	second := r.do(context.Background())
	<-r.joins
	short, cancelShort := context.WithCancel(context.Background())
	third := r.do(short)
	<-r.joins
	cancelShort()
	if err := <-third; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter whose ctx ended: %v, want canceled", err)
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v, want canceled", err)
	}
	<-r.started // the waiter's own run
	r.release <- 9
	if err := <-second; err != nil || r.runs.Load() != 2 {
		t.Fatalf("waiter: %v after %d runs, want its own run's result after 2", err, r.runs.Load())
	}
}

// TestGoInCallerGroup: Go's flight runs detached in an InCaller Group too:
// its starter's ctx ending does not end it.
func TestGoInCallerGroup(t *testing.T) {
	g := loader.Group[string, int]{InCaller: true}
	ctx, cancel := context.WithCancel(context.Background())
	release, ended := make(chan struct{}), make(chan error, 1)
	g.Go(ctx, "k", func(fctx context.Context) (int, error) {
		<-release
		ended <- fctx.Err()
		return 0, nil
	})
	cancel()
	close(release)
	if err := <-ended; err != nil {
		t.Fatalf("Go's flight saw its starter's cancellation: %v", err)
	}
}
