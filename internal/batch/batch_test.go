package batch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

type req struct{ in, out int }

// double answers every call with twice its input and records batch sizes.
type double struct {
	mu    sync.Mutex
	sizes []int
}

func (d *double) run(_ context.Context, calls []*batch.Call[req]) {
	for _, c := range calls {
		c.Req.out = 2 * c.Req.in
	}
	d.mu.Lock()
	d.sizes = append(d.sizes, len(calls))
	d.mu.Unlock()
}

func TestAloneRunsAtOnceInTheCallersGoroutine(t *testing.T) {
	var d double
	b := batch.New(1, 16, d.run, nil)
	c := &batch.Call[req]{}
	for i := range 5 {
		c.Req = req{in: i}
		if err := b.Do(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		if c.Req.out != 2*i {
			t.Fatalf("call %d answered %d, want %d", i, c.Req.out, 2*i)
		}
	}
	if len(d.sizes) != 5 {
		t.Fatalf("runs = %v, want five batches of one", d.sizes)
	}
	for _, n := range d.sizes {
		if n != 1 {
			t.Fatalf("runs = %v, want five batches of one", d.sizes)
		}
	}
}

// gated is a run whose first batch waits for release.
type gated struct {
	double
	entered chan struct{}
	release chan struct{}
	first   atomic.Bool
}

func newGated() *gated {
	return &gated{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gated) run(ctx context.Context, calls []*batch.Call[req]) {
	if g.first.CompareAndSwap(false, true) {
		close(g.entered)
		<-g.release
	}
	g.double.run(ctx, calls)
}

// waitPending blocks until n calls of b wait for a batch.
func waitPending(t *testing.T, b *batch.Batcher[req], n int) {
	t.Helper()
	until(t, func() bool { return b.Waiting() == n })
}

// until waits for state the Batcher sends no word of, for 10 s.
func until(t *testing.T, cond func() bool) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, "state", cond)
}

func TestWaitersGoTogetherInTheNextBatch(t *testing.T) {
	g := newGated()
	b := batch.New(1, 16, g.run, nil)
	first := &batch.Call[req]{Req: req{in: 100}}
	errs := make(chan error, 8)
	go func() { errs <- b.Do(context.Background(), first) }()
	<-g.entered
	calls := make([]*batch.Call[req], 6)
	for i := range calls {
		calls[i] = &batch.Call[req]{Req: req{in: i}}
		go func() { errs <- b.Do(context.Background(), calls[i]) }()
	}
	waitPending(t, b, len(calls))
	close(g.release)
	for range len(calls) + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range calls {
		if c.Req.out != 2*i {
			t.Fatalf("call %d answered %d", i, c.Req.out)
		}
	}
	if first.Req.out != 200 {
		t.Fatalf("first call answered %d", first.Req.out)
	}
	if len(g.sizes) != 2 || g.sizes[0] != 1 || g.sizes[1] != 6 {
		t.Fatalf("batches = %v, want [1 6]: the six waiters in one", g.sizes)
	}
}

func TestBatchesHoldAtMostMax(t *testing.T) {
	g := newGated()
	b := batch.New(1, 4, g.run, nil)
	errs := make(chan error, 16)
	go func() { errs <- b.Do(context.Background(), &batch.Call[req]{}) }()
	<-g.entered
	for i := range 10 {
		go func() { errs <- b.Do(context.Background(), &batch.Call[req]{Req: req{in: i}}) }()
	}
	waitPending(t, b, 10)
	close(g.release)
	for range 11 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for _, n := range g.sizes[1:] {
		if n > 4 {
			t.Fatalf("batches = %v: one holds more than 4", g.sizes)
		}
		total += n
	}
	if total != 10 || len(g.sizes) != 4 {
		t.Fatalf("batches = %v, want 1 then 4, 4, 2", g.sizes)
	}
}

func TestLimitBatchesRunAtOnce(t *testing.T) {
	var running, most atomic.Int32
	release := make(chan struct{})
	b := batch.New(3, 16, func(_ context.Context, calls []*batch.Call[req]) {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		running.Add(-1)
	}, nil)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if err := b.Do(context.Background(), &batch.Call[req]{}); err != nil {
				t.Error(err)
			}
		})
	}
	until(t, func() bool { return running.Load() == 3 })
	time.Sleep(20 * time.Millisecond) // a fourth batch would start now: nothing to wait on for one that must not
	close(release)
	wg.Wait()
	if most.Load() != 3 {
		t.Fatalf("at most %d batches ran at once, want the limit, 3", most.Load())
	}
}

func TestWaiterLeavesWhenItsContextEnds(t *testing.T) {
	g := newGated()
	b := batch.New(1, 16, g.run, nil)
	done := make(chan error, 1)
	go func() { done <- b.Do(context.Background(), &batch.Call[req]{}) }()
	<-g.entered
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	gone := &batch.Call[req]{Req: req{in: 7}}
	go func() { left <- b.Do(ctx, gone) }()
	stay := &batch.Call[req]{Req: req{in: 8}}
	stayed := make(chan error, 1)
	go func() { stayed <- b.Do(context.Background(), stay) }()
	waitPending(t, b, 2)
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do after cancel = %v, want context.Canceled", err)
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-stayed; err != nil || stay.Req.out != 16 {
		t.Fatalf("the waiter that stayed: %v, %d", err, stay.Req.out)
	}
	if gone.Req.out != 0 {
		t.Fatalf("a call that left was still run: out = %d", gone.Req.out)
	}
	if len(g.sizes) != 2 || g.sizes[1] != 1 {
		t.Fatalf("batches = %v, want [1 1]: the cancelled call left the queue", g.sizes)
	}
}

func TestPanicAnswersTheOthersAndTheBatcherGoesOn(t *testing.T) {
	g := newGated()
	boom := atomic.Bool{}
	b := batch.New(1, 16, func(ctx context.Context, calls []*batch.Call[req]) {
		if len(calls) > 1 && boom.CompareAndSwap(false, true) {
			panic("run failed")
		}
		g.run(ctx, calls)
	}, nil)
	errs := make(chan error, 8)
	go func() { errs <- b.Do(context.Background(), &batch.Call[req]{}) }()
	<-g.entered
	panics := make(chan any, 8)
	for range 3 {
		go func() {
			defer func() {
				if p := recover(); p != nil {
					panics <- p
					errs <- nil
				}
			}()
			errs <- b.Do(context.Background(), &batch.Call[req]{})
		}()
	}
	waitPending(t, b, 3)
	close(g.release)
	var panicked int
	for range 4 {
		if err := <-errs; errors.Is(err, batch.ErrPanicked) {
			panicked++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if len(panics) != 1 || panicked != 2 {
		t.Fatalf("%d panics and %d ErrPanicked, want the leader's panic and the two others told", len(panics), panicked)
	}
	c := &batch.Call[req]{Req: req{in: 4}}
	if err := b.Do(context.Background(), c); err != nil || c.Req.out != 8 {
		t.Fatalf("after the panic: %v, %d: the batcher must go on", err, c.Req.out)
	}
}

func TestManyCallersEachGetTheirOwnAnswer(t *testing.T) {
	var d double
	b := batch.New(2, 32, d.run, nil)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			c := &batch.Call[req]{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := range 300 {
				if i == 299 && w%8 == 0 {
					cancel() // some leave on the last call: the rest are unaffected
				}
				c.Req = req{in: w*1000 + i}
				err := b.Do(ctx, c)
				if errors.Is(err, context.Canceled) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if c.Req.out != 2*(w*1000+i) {
					t.Errorf("caller %d call %d answered %d", w, i, c.Req.out)
					return
				}
			}
		})
	}
	wg.Wait()
	calls := 0
	for _, n := range d.sizes {
		calls += n
	}
	if calls < 64*299 || calls > 64*300 {
		t.Fatalf("%d calls run, want between %d and %d", calls, 64*299, 64*300)
	}
}

// TestLeaderLeavesWithItsContext: the caller that leads a shared batch
// returns when its own ctx ends, while the batch goes on for the others.
func TestLeaderLeavesWithItsContext(t *testing.T) {
	g := newGated()
	shared, sharedEntered := make(chan struct{}), make(chan struct{})
	var d double
	b := batch.New(1, 16, func(ctx context.Context, calls []*batch.Call[req]) {
		if len(calls) > 1 {
			close(sharedEntered)
			<-shared
			d.run(ctx, calls)
			return
		}
		g.run(ctx, calls)
	}, nil)
	first := make(chan error, 1)
	go func() { first <- b.Do(context.Background(), &batch.Call[req]{}) }()
	<-g.entered
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader := make(chan error, 1)
	go func() { leader <- b.Do(ctx, &batch.Call[req]{Req: req{in: 1}}) }() // oldest: leads the next batch
	waitPending(t, b, 1)
	others := []*batch.Call[req]{{Req: req{in: 2}}, {Req: req{in: 3}}}
	errs := make(chan error, 2)
	for _, c := range others {
		go func() { errs <- b.Do(context.Background(), c) }()
	}
	waitPending(t, b, 3)
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-sharedEntered
	cancel()
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Fatalf("leader: %v, want context.Canceled while its batch is held", err)
	}
	close(shared)
	for range others {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range others {
		if c.Req.out != 2*c.Req.in {
			t.Fatalf("call %d answered %d", c.Req.in, c.Req.out)
		}
	}
	if len(d.sizes) != 1 || d.sizes[0] != 3 {
		t.Fatalf("shared batches %v, want one of 3 (the leader's request too)", d.sizes)
	}
}

// TestHoldGathersUntilRelease: while a place is held, calls queue (each is
// told through Queued) and, once it is released, run as one batch.
func TestHoldGathersUntilRelease(t *testing.T) {
	var d double
	b := batch.New(1, 16, d.run, nil)
	b.Hold()
	var queued atomic.Int32
	var wg sync.WaitGroup
	calls := make([]*batch.Call[req], 5)
	for i := range calls {
		calls[i] = &batch.Call[req]{Req: req{in: i}, Queued: func() { queued.Add(1) }}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Do(context.Background(), calls[i]); err != nil {
				t.Error(err)
			}
		}()
	}
	redistest.Eventually(t, 5*time.Second, "5 calls queue behind the held place", func() bool { return queued.Load() == 5 })
	if b.Waiting() != 5 || len(d.sizes) != 0 {
		t.Fatalf("%d waiting, batches %v: want 5 waiting and none run while held", b.Waiting(), d.sizes)
	}
	b.Release()
	wg.Wait()
	if len(d.sizes) != 1 || d.sizes[0] != 5 {
		t.Fatalf("batches %v, want one of 5", d.sizes)
	}
	for i, c := range calls {
		if c.Req.out != 2*i {
			t.Fatalf("call %d: %d", i, c.Req.out)
		}
	}
}

// held is a run whose every batch waits until the test releases it: each
// batch sends its gate on entered, in the order they start.
type held struct {
	double
	entered chan chan struct{}
}

// newHeld returns a Batcher of limit and max whose batches h holds, the
// channel its calls' Do return on, and do, which starts a Do of in.
func newHeld(limit, max int) (*held, *batch.Batcher[req], chan error, func(in int)) {
	h := &held{entered: make(chan chan struct{}, 128)}
	b := batch.New(limit, max, h.run, nil)
	errs := make(chan error, 128)
	do := func(in int) { go func() { errs <- b.Do(context.Background(), &batch.Call[req]{Req: req{in: in}}) }() }
	return h, b, errs, do
}

func (h *held) run(ctx context.Context, calls []*batch.Call[req]) {
	gate := make(chan struct{})
	h.entered <- gate
	<-gate
	h.double.run(ctx, calls)
}

// TestLoneCallerRidesTheNextBatchWhileASharedOneRuns: with a batch of
// several in flight and nobody waiting, a caller does not open a round
// trip for itself (the shared batch's callers come back together: it rides
// with them); with only a batch of one in flight it does (the control).
func TestLoneCallerRidesTheNextBatchWhileASharedOneRuns(t *testing.T) {
	h, b, errs, do := newHeld(2, 16)
	do(1)
	gateA := <-h.entered
	do(2) // a batch of one in flight: it leads its own (the control)
	gateB := <-h.entered
	do(3)
	do(4)
	waitPending(t, b, 2)
	close(gateA) // 3 and 4 go as one batch, held
	gateCD := <-h.entered
	close(gateB) // in flight now: the batch of two alone
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	do(5)
	waitPending(t, b, 1) // it waits for the shared batch, with a place free
	select {
	case g := <-h.entered:
		close(g)
		t.Fatal("a lone caller opened a batch of its own while a shared one ran")
	case <-time.After(20 * time.Millisecond): // nothing to wait on for a batch that must not start
	}
	close(gateCD)
	close(<-h.entered) // 5, after the shared batch ended
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if want := []int{1, 1, 2, 1}; !slices.Equal(h.sizes, want) {
		t.Fatalf("batches = %v, want %v", h.sizes, want)
	}
}

// TestBurstGathersWhileItArrives: a caller that takes the free place right
// after a shared batch ended yields while its yields bring callers (the
// shared batch's, coming back), and they ride its batch; a yield that brings
// none ends it, and so do burstYields yields, and a full batch. The hook
// that stands for runtime.Gosched queues the callers itself, one per yield,
// so the interleaving is forced. (Control: with the single yield of before,
// the batch carried one waiting caller, not three.)
func TestBurstGathersWhileItArrives(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max       int
		arrive    int // yields that each bring one caller
		yields    int // yields expected
		batchSize int // the gathering caller's batch, expected
	}{
		{"ends when a yield brings nobody", 16, 3, 4, 4},
		{"at most burstYields", 64, 100, 8, 9},
		{"ends when the batch is full", 4, 100, 3, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, b, errs, do := newHeld(1, tc.max)
			yields := 0
			b.OnYield(func() { // runs in the gathering caller's goroutine
				yields++
				if yields <= tc.arrive {
					queued := make(chan struct{})
					c := &batch.Call[req]{Req: req{in: 100 + yields}, Queued: func() { close(queued) }}
					go func() { errs <- b.Do(context.Background(), c) }()
					select { // not waitPending: this is not the test's goroutine
					case <-queued:
					case <-time.After(10 * time.Second):
						t.Error("the caller started in the hook never waited")
					}
				}
			})
			// A shared batch, then its end with nobody waiting: the burst.
			queueTwoBehindOne(t, h, b, do)
			close(entered(t, h)) // 2 and 3
			for range 3 {
				answered(t, errs)
			}
			if yields != 0 {
				t.Fatalf("%d yields before the shared batch ended", yields)
			}
			// The shared batch answers its callers before it gives its
			// place back: wait for that, or 4 would queue for it.
			until(t, func() bool { return b.InFlight() == 0 })
			do(4) // takes the free place, and gathers
			close(entered(t, h))
			until(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return len(h.sizes) == 3 })
			if yields != tc.yields {
				t.Errorf("yielded %d times, want %d", yields, tc.yields)
			}
			h.mu.Lock()
			sizes := slices.Clone(h.sizes)
			h.mu.Unlock()
			if sizes[2] != tc.batchSize {
				t.Errorf("batches = %v, want [1 2 %d]: the caller's batch with the %d that came while it yielded", sizes, tc.batchSize, tc.batchSize-1)
			}
			// Every call is answered, those the batch left too: they lead each other on.
			for left := min(yields, tc.arrive) + 1; left > 0; {
				select {
				case g := <-h.entered:
					close(g)
				case err := <-errs:
					if err != nil {
						t.Fatal(err)
					}
					left--
				case <-time.After(10 * time.Second):
					t.Fatalf("%d calls never answered", left)
				}
			}
		})
	}
}

// queueTwoBehindOne starts call 1 and holds its batch, queues calls 2 and 3
// behind it, and lets 1 end: 2 and 3 are handed the place.
func queueTwoBehindOne(t *testing.T, h *held, b *batch.Batcher[req], do func(int)) {
	t.Helper()
	do(1)
	gate := entered(t, h)
	do(2)
	do(3)
	waitPending(t, b, 2)
	close(gate)
}

// answered fails the test unless a call returns nil from Do within 10 s.
func answered(t *testing.T, errs <-chan error) {
	t.Helper()
	select {
	case err := <-errs:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call was not answered in 10 s")
	}
}

// entered is the gate of the next batch h holds, failing the test if none
// starts within 10 s.
func entered(t *testing.T, h *held) chan struct{} {
	t.Helper()
	select {
	case g := <-h.entered:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("no batch started in 10 s")
		return nil
	}
}

// TestMaxOneLeavesNoSharedBatchBehind: with a batch of at most one call,
// waiting calls each run alone, and afterwards a lone caller still runs at
// once. (Control: counting such a batch as shared left the batcher
// believing one in flight, and the lone caller waited for a next batch
// that never came, until its ctx ended.)
func TestMaxOneLeavesNoSharedBatchBehind(t *testing.T) {
	h, b, errs, do := newHeld(1, 1)
	queueTwoBehindOne(t, h, b, do)
	close(entered(t, h))
	close(entered(t, h))
	for range 3 {
		answered(t, errs)
	}
	until(t, func() bool { return b.InFlight() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { errs <- b.Do(ctx, &batch.Call[req]{Req: req{in: 4}}) }()
	close(entered(t, h))
	answered(t, errs)
	h.mu.Lock()
	defer h.mu.Unlock()
	if want := []int{1, 1, 1, 1}; !slices.Equal(h.sizes, want) {
		t.Fatalf("batches = %v, want %v", h.sizes, want)
	}
}

// TestDetachedCallerLeavesAtUntil: a detached call that runs alone runs in
// a goroutine of its own, and its caller leaves at Until while the run is
// held; without Detached the caller runs it and stays (the control).
func TestDetachedCallerLeavesAtUntil(t *testing.T) {
	for _, detached := range []bool{true, false} {
		h := &held{entered: make(chan chan struct{}, 1)}
		b := batch.New(1, 16, h.run, nil)
		c := &batch.Call[req]{Req: req{in: 7}, Detached: detached, Until: time.Now().Add(50 * time.Millisecond)}
		errs := make(chan error, 1)
		go func() { errs <- b.Do(context.Background(), c) }()
		gate := <-h.entered
		wait := 200 * time.Millisecond // the control: a caller that must stay
		if detached {
			wait = 5 * time.Second
		}
		select {
		case err := <-errs:
			if !detached {
				t.Fatalf("a call run in its caller's goroutine returned (%v) while its run was held", err)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("detached: Do returned %v at Until, want context.DeadlineExceeded", err)
			}
			close(gate)
		case <-time.After(wait):
			if detached {
				t.Fatal("detached: the caller stayed past Until while its run was held")
			}
			close(gate)
			if err := <-errs; err != nil || c.Req.out != 14 {
				t.Fatalf("not detached: %v, answered %d", err, c.Req.out)
			}
		}
		until(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return len(h.sizes) == 1 })
	}
}

// TestEachWaiterLeavesAtItsOwnUntil: calls waiting with Untils share one
// alarm. Queued latest Until first, then an earlier one (the alarm is armed
// earlier), then a later one, while a run is held: each leaves with
// context.DeadlineExceeded, none before its own Until (the alarm rang for
// another's), and a call without an Until stays for its answer.
func TestEachWaiterLeavesAtItsOwnUntil(t *testing.T) {
	g := newGated()
	b := batch.New(1, 16, g.run, nil)
	first := make(chan error, 1)
	go func() { first <- b.Do(context.Background(), &batch.Call[req]{}) }()
	<-g.entered
	t0 := time.Now()
	untils := []time.Duration{200 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond}
	left := make(chan error, len(untils))
	for i, d := range untils {
		c := &batch.Call[req]{Req: req{in: i}, Until: t0.Add(d)}
		go func() {
			err := b.Do(context.Background(), c)
			if now := time.Now(); now.Before(c.Until) {
				err = fmt.Errorf("call %d (Until %v) left %v before it: %v", i, d, c.Until.Sub(now), err)
			}
			left <- err
		}()
		waitPending(t, b, i+1)
	}
	stay := &batch.Call[req]{Req: req{in: 8}}
	stayed := make(chan error, 1)
	go func() { stayed <- b.Do(context.Background(), stay) }()
	for range untils {
		select {
		case err := <-left:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a waiter with an Until: %v, want context.DeadlineExceeded at its Until", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter stayed past its Until while the run was held")
		}
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-stayed; err != nil || stay.Req.out != 16 {
		t.Fatalf("the waiter without an Until: %v, answered %d", err, stay.Req.out)
	}
}

// TestStopDisarmsTheAlarm: a call answered long before its Until leaves the
// alarm armed for it; Stop disarms it (and says it was armed), so nothing of
// the batcher's runs at that Until: a second Stop finds it disarmed.
// Control: a Stop that leaves the timer set waits out the hour.
func TestStopDisarmsTheAlarm(t *testing.T) {
	var d double
	b := batch.New(1, 16, d.run, nil)
	c := &batch.Call[req]{Req: req{in: 3}, Until: time.Now().Add(time.Hour)}
	if err := b.Do(context.Background(), c); err != nil || c.Req.out != 6 {
		t.Fatalf("Do: %v, answered %d", err, c.Req.out)
	}
	if !stopWithin(t, b) {
		t.Fatal("Stop: the alarm was not armed after a call with an Until")
	}
	if stopWithin(t, b) {
		t.Fatal("a second Stop found the alarm still armed")
	}
}

// stopWithin is b.Stop(), failing the test if it takes over 5 s.
func stopWithin(t *testing.T, b *batch.Batcher[req]) bool {
	t.Helper()
	armed := make(chan bool, 1)
	go func() { armed <- b.Stop() }()
	select {
	case a := <-armed:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("Stop still waits after 5 s: the alarm it should have disarmed is set")
		return false
	}
}

// TestStopWaitsForARingUnderWay: Stop returns only once a ring that had
// begun is over (held here before it takes the batcher's lock).
func TestStopWaitsForARingUnderWay(t *testing.T) {
	var d double
	b := batch.New(1, 16, d.run, nil)
	ringing, release := make(chan struct{}), make(chan struct{})
	var over atomic.Bool
	b.OnRing(func() {
		close(ringing)
		<-release
		over.Store(true)
	})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) }) // a failed run leaves no ring blocked
	c := &batch.Call[req]{Until: time.Now().Add(time.Millisecond)}
	if err := b.Do(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	<-ringing
	stopped := make(chan bool, 1)
	go func() {
		b.Stop()
		stopped <- over.Load()
	}()
	select {
	case <-stopped:
		t.Fatal("Stop returned while the alarm was still ringing")
	case <-time.After(50 * time.Millisecond):
	}
	releaseOnce.Do(func() { close(release) })
	if !<-stopped {
		t.Fatal("Stop returned before the ring was over")
	}
}
