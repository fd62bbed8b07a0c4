package aside

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/batch"
)

// readingUntil returns a read function that counts its calls, signals
// started, and returns release's value (or its ctx's error if that ends
// first).
func readingUntil(calls *atomic.Int32, started chan<- struct{}, release <-chan sharedRead) func(context.Context) (sharedRead, error) {
	return func(ctx context.Context) (sharedRead, error) {
		calls.Add(1)
		started <- struct{}{}
		select {
		case sr := <-release:
			return sr, nil
		case <-ctx.Done():
			return sharedRead{}, ctx.Err()
		}
	}
}

// reads is a readGroup with a read function to drive: fn counts its
// calls, signals started and returns what release sends.
type reads struct {
	rg      readGroup
	calls   atomic.Int32
	started chan struct{}
	release chan sharedRead
	joins   chan struct{} // a caller waits for the read under way
	fn      func(context.Context) (sharedRead, error)
}

func newReads() *reads {
	r := &reads{started: make(chan struct{}, 4), release: make(chan sharedRead, 4), joins: make(chan struct{}, 8)}
	r.rg.joined = func() { r.joins <- struct{}{} }
	r.fn = readingUntil(&r.calls, r.started, r.release)
	return r
}

// goDo calls rg.do for key "k" in a goroutine and returns its error.
func goDo(rg *readGroup, ctx context.Context, fn func(context.Context) (sharedRead, error)) <-chan error {
	errc := make(chan error, 1)
	go func() { _, _, err := rg.do(ctx, "k", fn); errc <- err }()
	return errc
}

// within receives from ch, failing the test if nothing comes for 5 s (a
// read that never ends, or a caller stuck waiting for one).
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("nothing from %s within 5 s", what)
		panic("unreachable")
	}
}

// waitJoined waits until n callers of r wait for a read under way.
func (r *reads) waitJoined(t *testing.T, n int) {
	t.Helper()
	for range n {
		within(t, r.joins, "a caller joining the read")
	}
}

// TestReadGroupShares: callers that arrive while a read of their key is
// under way get its result (one read), and a caller of another key reads
// for itself.
func TestReadGroupShares(t *testing.T) {
	r := newReads()
	rg, calls, started, release, fn := &r.rg, &r.calls, r.started, r.release, r.fn
	type out struct {
		sr     sharedRead
		shared bool
		err    error
	}
	outs := make(chan out, 3)
	for range 3 {
		go func() {
			sr, shared, err := rg.do(context.Background(), "k", fn)
			outs <- out{sr, shared, err}
		}()
	}
	within(t, started, "the read")
	r.waitJoined(t, 2)
	release <- sharedRead{epoch: 7}
	sharedN := 0
	for range 3 {
		o := within(t, outs, "a caller")
		if o.err != nil || o.sr.epoch != 7 {
			t.Fatalf("caller got %+v, %v", o.sr, o.err)
		}
		if o.shared {
			sharedN++
		}
	}
	if calls.Load() != 1 || sharedN != 2 {
		t.Fatalf("%d reads, %d shared answers: want 1 read answering 3 callers", calls.Load(), sharedN)
	}
	if _, _, err := rg.do(context.Background(), "k", func(context.Context) (sharedRead, error) { return sharedRead{epoch: 8}, nil }); err != nil {
		t.Fatal(err)
	}
	if len(rg.calls) != 0 {
		t.Fatalf("finished reads left behind: %v", rg.calls)
	}
}

// TestReadGroupWaiterLeaves: a waiting caller leaves when its own ctx
// ends; the read goes on for the one that runs it.
func TestReadGroupWaiterLeaves(t *testing.T) {
	r := newReads()
	rg, calls, started, release, fn := &r.rg, &r.calls, r.started, r.release, r.fn
	first := goDo(rg, context.Background(), fn)
	within(t, started, "the read")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := rg.do(ctx, "k", fn); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter: %v, want its ctx's deadline", err)
	}
	release <- sharedRead{}
	if err := within(t, first, "the first caller"); err != nil || calls.Load() != 1 {
		t.Fatalf("first caller: %v after %d reads", err, calls.Load())
	}
}

// TestReadGroupLeaderGivesUp: when the caller running the read gives up
// (its ctx ends), the callers waiting for it read again instead of taking
// its error.
func TestReadGroupLeaderGivesUp(t *testing.T) {
	r := newReads()
	rg, calls, started, release, fn := &r.rg, &r.calls, r.started, r.release, r.fn
	ctx, cancel := context.WithCancel(context.Background())
	first := goDo(rg, ctx, fn)
	within(t, started, "the first read")
	second := make(chan error, 1)
	go func() {
		sr, _, err := rg.do(context.Background(), "k", fn)
		if err == nil && sr.epoch != 9 {
			err = errors.New("wrong result")
		}
		second <- err
	}()
	r.waitJoined(t, 1)
	cancel()
	if err := within(t, first, "the first caller"); !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v, want canceled", err)
	}
	within(t, started, "the waiter's own read")
	release <- sharedRead{epoch: 9}
	if err := within(t, second, "the waiter"); err != nil || calls.Load() != 2 {
		t.Fatalf("waiter: %v after %d reads, want its own read's result after 2", err, calls.Load())
	}
}

// TestReadGroupForgetAndPanic: after forget the next caller starts a new
// read while the old one is still under way; a read that panics lets the
// panic go up its caller and sends its waiters to read again.
func TestReadGroupForgetAndPanic(t *testing.T) {
	r := newReads()
	rg, calls, started, release, fn := &r.rg, &r.calls, r.started, r.release, r.fn
	first := goDo(rg, context.Background(), fn)
	within(t, started, "the first read")
	rg.forget("k", nil)
	second := goDo(rg, context.Background(), fn)
	within(t, started, "a second read (the first was forgotten)")
	release <- sharedRead{}
	release <- sharedRead{}
	if err1, err2 := within(t, first, "the first caller"), within(t, second, "the second caller"); err1 != nil || err2 != nil || calls.Load() != 2 {
		t.Fatalf("%v, %v after %d reads, want 2 reads", err1, err2, calls.Load())
	}

	entered, unblock := make(chan struct{}), make(chan struct{})
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		_, _, _ = rg.do(context.Background(), "p", func(context.Context) (sharedRead, error) {
			close(entered)
			<-unblock
			panic("boom")
		})
	}()
	within(t, entered, "the read that panics")
	waiter := make(chan error, 1)
	go func() {
		_, shared, err := rg.do(context.Background(), "p", func(context.Context) (sharedRead, error) { return sharedRead{}, nil })
		if shared {
			err = errors.New("took the panicked read's result")
		}
		waiter <- err
	}()
	r.waitJoined(t, 1)
	close(unblock)
	if p := within(t, panicked, "the panicking caller"); p != "boom" {
		t.Fatalf("the panic did not reach its caller: %v", p)
	}
	if err := within(t, waiter, "the waiter"); err != nil {
		t.Fatalf("waiter after the panic: %v", err)
	}
}

// TestLatestDeadline: a shared round trip runs until the latest of its
// callers' deadlines; one caller without a deadline leaves it to
// RedisTimeout (zero).
func TestLatestDeadline(t *testing.T) {
	now := time.Now()
	flight := func(d time.Time) *batch.Call[readReq] {
		return &batch.Call[readReq]{Req: readReq{deadline: d}}
	}
	for _, tc := range []struct {
		name  string
		calls []*batch.Call[readReq]
		want  time.Time
	}{
		{"one", []*batch.Call[readReq]{flight(now)}, now},
		{"latest wins", []*batch.Call[readReq]{flight(now), flight(now.Add(time.Second)), flight(now.Add(-time.Second))}, now.Add(time.Second)},
		{"one without", []*batch.Call[readReq]{flight(now), flight(time.Time{}), flight(now.Add(time.Second))}, time.Time{}},
		{"first without", []*batch.Call[readReq]{flight(time.Time{}), flight(now)}, time.Time{}},
	} {
		if got := latestDeadline(tc.calls); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
