package loader_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/loader"
)

// TestMain starts a redis-server for the Coordinator tests and checks that
// no goroutine outlives the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

func TestOneFlightManyCallers(t *testing.T) {
	var g loader.Group[int]
	var calls atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]int, 100)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			v, _, err := g.Do(ctx, "k", func(context.Context) (int, error) {
				calls.Add(1)
				<-release
				return 7, nil
			})
			if err != nil {
				t.Error(err)
			}
			results[i] = v
		}()
	}
	for calls.Load() == 0 {
		runtime.Gosched()
	}
	time.Sleep(20 * time.Millisecond) // let the rest join the flight
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
	var g loader.Group[int]
	start := make(chan struct{})
	var wg sync.WaitGroup
	var errs atomic.Int32
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, _, err := g.Do(ctx, "k", func(context.Context) (int, error) {
				<-start
				panic("boom")
			})
			if errors.Is(err, loader.ErrPanic) {
				errs.Add(1)
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
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
	g := loader.Group[string]{Timeout: 5 * time.Second}
	release := make(chan struct{})
	var sawCancel atomic.Bool
	fn := func(ctx context.Context) (string, error) {
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
	go func() {
		time.Sleep(5 * time.Millisecond)
		v, _, err := g.Do(context.Background(), "k", fn)
		if err != nil {
			t.Error(err)
		}
		patient <- v
	}()
	if _, _, err := g.Do(short, "k", fn); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("impatient caller: err = %v, want DeadlineExceeded", err)
	}
	close(release)
	if v := <-patient; v != "v" {
		t.Fatalf("patient caller got %q", v)
	}
	if sawCancel.Load() {
		t.Fatal("the first caller's deadline reached the flight")
	}
}

func TestTimeoutBoundsFlight(t *testing.T) {
	g := loader.Group[int]{Timeout: 20 * time.Millisecond}
	_, _, err := g.Do(context.Background(), "k", func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// TestDoEarly: callers whose accept takes the early result return it while
// the flight goes on; the others (and a caller that joins after it) get
// the flight's own result; fn runs once.
func TestDoEarly(t *testing.T) {
	var g loader.Group[int]
	var calls atomic.Int32
	answered, finish := make(chan struct{}), make(chan struct{})
	fn := func(_ context.Context, early func(int, error)) (int, error) {
		calls.Add(1)
		early(1, nil)
		early(9, nil) // ignored: only the first counts
		close(answered)
		<-finish
		return 2, nil
	}
	takes := func(r int) bool { return r == 1 }
	refuses := func(int) bool { return false }
	type res struct {
		v   int
		err error
	}
	run := func(accept func(int) bool) chan res {
		out := make(chan res, 1)
		go func() {
			v, _, err := g.DoEarly(context.Background(), "k", fn, accept)
			out <- res{v, err}
		}()
		return out
	}
	first := run(takes)
	<-answered
	if r := <-first; r.v != 1 || r.err != nil {
		t.Fatalf("the caller that takes the early result got %+v", r)
	}
	late := run(takes) // joins after the early result: takes it too
	if r := <-late; r.v != 1 || r.err != nil {
		t.Fatalf("a later caller that takes it got %+v", r)
	}
	other := run(refuses)
	none := run(nil)
	select {
	case r := <-other:
		t.Fatalf("a caller that refuses the early result returned %+v before the flight ended", r)
	case r := <-none:
		t.Fatalf("a caller without accept returned %+v before the flight ended", r)
	case <-time.After(20 * time.Millisecond):
	}
	close(finish)
	if r := <-other; r.v != 2 || r.err != nil {
		t.Fatalf("the caller that refused got %+v, want the flight's result", r)
	}
	if r := <-none; r.v != 2 || r.err != nil {
		t.Fatalf("the caller without accept got %+v, want the flight's result", r)
	}
	if calls.Load() != 1 {
		t.Fatalf("fn ran %d times, want 1", calls.Load())
	}
	// The flight ended: the next call runs a new one.
	if v, _, err := g.DoEarly(context.Background(), "k", func(context.Context, func(int, error)) (int, error) { return 3, nil }, takes); v != 3 || err != nil {
		t.Fatalf("after the flight: %d, %v", v, err)
	}
}

// TestDoEarlyPanicAfterAnswer: a flight that panics after answering early
// fails only the callers still waiting for it, with ErrPanic.
func TestDoEarlyPanicAfterAnswer(t *testing.T) {
	var g loader.Group[int]
	answered, boom := make(chan struct{}), make(chan struct{})
	fn := func(_ context.Context, early func(int, error)) (int, error) {
		early(1, errors.New("early error"))
		close(answered)
		<-boom
		panic("after the answer")
	}
	first := make(chan error, 1)
	go func() {
		_, _, err := g.DoEarly(context.Background(), "k", fn, func(int) bool { return true })
		first <- err
	}()
	<-answered
	if err := <-first; err == nil || err.Error() != "early error" {
		t.Fatalf("early caller: %v, want the early error", err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, _, err := g.DoEarly(context.Background(), "k", fn, func(int) bool { return false })
		waiting <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it join
	close(boom)
	if err := <-waiting; !errors.Is(err, loader.ErrPanic) {
		t.Fatalf("waiting caller: %v, want ErrPanic", err)
	}
}

// TestDoEarlyOnJoin: onJoin runs for each caller that joins the flight
// under way, before it waits (here the flight waits for every joiner's
// onJoin, as a flight may wait for a lock a joiner holds), and never for
// the caller that starts the flight.
func TestDoEarlyOnJoin(t *testing.T) {
	var g loader.Group[int]
	const joiners = 5
	var joined sync.WaitGroup
	joined.Add(joiners)
	started := make(chan struct{})
	var starterJoined atomic.Bool
	results := make(chan int, joiners+1)
	go func() {
		v, _, err := g.DoEarlyOnJoin(context.Background(), "k", func(context.Context, func(int, error)) (int, error) {
			close(started)
			joined.Wait() // would never end if a joiner waited before its onJoin
			return 7, nil
		}, nil, func() { starterJoined.Store(true) })
		if err != nil {
			t.Error(err)
		}
		results <- v
	}()
	<-started
	for range joiners {
		go func() {
			v, _, err := g.DoEarlyOnJoin(context.Background(), "k", func(context.Context, func(int, error)) (int, error) {
				t.Error("a joiner's function ran")
				return 0, nil
			}, nil, joined.Done)
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
