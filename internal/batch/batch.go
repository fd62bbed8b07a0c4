// Package batch merges concurrent requests into shared round trips, as a
// database's group commit does. A request that finds fewer than the limit of
// batches in flight runs in its caller's goroutine, with whatever requests
// were waiting; one that finds them all busy waits, and when a batch ends the
// first waiting request leads all the waiting ones as the next. With no
// contention nothing is added; under load the round trips per request fall.
// A request that takes a free place after a shared batch ended first yields
// the processor while its yields bring requests (at most burstYields times),
// so that the requests of the same burst (that batch's callers) join it; and
// while a shared batch is in flight, a request that finds nobody waiting
// waits for the next batch rather than open a round trip of its own (that
// batch's callers come back together).
// A batch of several runs in a goroutine of its own, started by its leader
// and ending when it has run, so that every caller can leave on its own ctx
// while the others still get their answers; so does a Detached request's.
package batch

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// ErrPanicked is what Do returns to the requests of a batch whose run
// panicked in another caller's goroutine (the panic goes on up that one).
var ErrPanicked = errors.New("batch: the run of this request's batch panicked")

// state is where a Call is; Batcher.mu guards it from the moment the call
// waits until it is taken into a batch.
type state uint8

const (
	running state = iota // leads its own batch, or is not in the batcher
	waiting              // in Batcher.pending
	batched              // taken into a batch that another caller runs
	leading              // taken, and woken to run lead
)

// Call is one request: Req is the request, and its result once Do returns
// nil (run writes it). A Call can be used again after Do returned nil; not
// after Do returned an error, when a batch may still write to it.
type Call[Q any] struct {
	Req Q
	// Queued, if set, is called when the call starts waiting for a batch
	// (after it is in the queue, outside the batcher's lock).
	Queued func()
	// Detached, if set, runs the call's batch in a goroutine of its own even
	// when it runs alone, so that the caller can leave on its ctx, or at
	// Until, while the run goes on (a run that ctx cannot stop).
	Detached bool
	// Until, if not zero, is when Do returns context.DeadlineExceeded if c
	// is not answered by then, as if ctx had ended.
	Until time.Time

	done     chan struct{} // buffered (1): sent once when the call is answered or must lead; made on first wait
	lead     []*Call[Q]    // the batch this call must run (state leading)
	state    state
	err      error       // ErrPanicked, set before done
	panicked any         // what run panicked with, for the leader to raise
	one      [1]*Call[Q] // the batch of a call that runs alone, without an allocation
}

// Batcher runs Calls in batches. Its methods are safe for concurrent use.
type Batcher[Q any] struct {
	run   func(ctx context.Context, calls []*Call[Q]) // answers every call's Req
	limit int                                         // batches in flight at most
	max   int                                         // calls per batch at most
	spawn func(func())                                // starts the goroutine of a shared batch (its owner's: see New)

	mu       sync.Mutex // guards inflight, shared, burst, pending, the state of calls in pending, and the alarm
	inflight int        // batches running
	shared   int        // of them, those of several calls
	burst    bool       // the last batch to end had several calls
	pending  []*Call[Q] // calls waiting for a batch, oldest first

	// The alarm wakes the calls that wait with an Until: one timer for
	// them all, not one each (each wait on a timer of its own would put it
	// in the runtime's timer heap and take it out: docs/design.md). It
	// rings (closes ring) at the earliest Until armed since it last rang;
	// a call it wakes before its own Until arms it again.
	alarm  *time.Timer
	ringAt time.Time      // when the alarm rings; zero: not armed
	ring   chan struct{}  // closed when it rings, then replaced
	rings  sync.WaitGroup // one per ring scheduled and not yet over: Stop waits for them

	testRang  func() // if set (by a test, before the first Do), runs as the alarm rings, before it takes mu
	testYield func() // if set (by a test, before the first Do), runs instead of runtime.Gosched in gatherBurstLocked
}

// New returns a Batcher that runs up to limit batches at once, each of at
// most max calls, with run. run must answer every call it is given, and
// should bound its work by the ctx it is given (for a batch of several
// calls it is the leading caller's, without its cancellation: see Do):
// the batch holds its place in flight until run returns.
//
// spawn starts the goroutine a shared batch runs in, so that its owner can
// wait for it (nil: a plain go statement).
func New[Q any](limit, max int, run func(ctx context.Context, calls []*Call[Q]), spawn func(func())) *Batcher[Q] {
	if spawn == nil {
		spawn = func(f func()) { go f() }
	}
	return &Batcher[Q]{run: run, limit: max1(limit), max: max1(max), spawn: spawn}
}

func max1(n int) int { return max(n, 1) }

// Do runs c, alone or in a batch, and returns when c.Req holds its result:
// then the error is nil. If ctx ends first, Do returns ctx.Err() at once;
// a batch that took c may still answer it afterwards, into nothing. A
// request that runs alone runs in the caller's goroutine on ctx (unless
// Detached). A batch
// of several runs in a goroutine of its own, on the leading caller's ctx
// without its cancellation (the others wait for it), which ends when run
// returns; the leading caller waits for it as the others do, so no caller
// stays past its own ctx.
func (b *Batcher[Q]) Do(ctx context.Context, c *Call[Q]) error {
	c.err, c.lead, c.panicked = nil, nil, nil
	b.mu.Lock()
	if b.inflight < b.limit && (b.shared == 0 || b.burst || len(b.pending) > 0) {
		b.inflight++
		if b.burst {
			b.gatherBurstLocked()
		}
		batch := b.takeLocked(c)
		ring := b.armLocked(c.Until)
		b.mu.Unlock()
		return b.lead(ctx, batch, c, ring)
	}
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	c.state = waiting
	b.pending = append(b.pending, c)
	ring := b.armLocked(c.Until)
	b.mu.Unlock()
	if c.Queued != nil {
		c.Queued()
	}
	if err := b.await(ctx, c, ring); err != nil {
		return b.leave(ctx, c, err)
	}
	if c.state == leading { // written before done was sent
		if len(c.lead) == 1 && ctx.Err() != nil {
			// Woken to run only its own request, after ctx ended (select
			// chose done): nobody waits for the answer.
			b.handOff(false)
			return ctx.Err()
		}
		return b.lead(ctx, c.lead, c, ring)
	}
	return c.err
}

// burstYields bounds gatherBurstLocked's yields: the delay it adds to a
// batch is at most this many turns of the scheduler.
const burstYields = 8

// gatherBurstLocked is for a request that took a free place right after a
// shared batch ended: that batch's callers, woken together, come back
// together, over several turns of the scheduler (each decodes its answer
// first). It yields while more requests wait after each yield than before
// it, and those ride its batch, not one round trip each. It stops at a
// yield after which no more wait (without a burst it costs one), at
// burstYields, or when the batch is full. b.mu is held, and released while
// it yields.
func (b *Batcher[Q]) gatherBurstLocked() {
	for range burstYields {
		n := len(b.pending)
		if n >= b.max-1 { // the batch is full
			return
		}
		b.mu.Unlock()
		b.yield()
		b.mu.Lock()
		if len(b.pending) <= n {
			return
		}
	}
}

// yield gives the processor to the runnable goroutines (a test's hook, if set).
func (b *Batcher[Q]) yield() {
	if b.testYield != nil {
		b.testYield()
		return
	}
	runtime.Gosched()
}

// leave is Do's return with err for c, whose ctx ended (or Until passed)
// while it waited.
func (b *Batcher[Q]) leave(ctx context.Context, c *Call[Q], err error) error {
	b.mu.Lock()
	switch c.state {
	case waiting:
		b.removeLocked(c)
		b.mu.Unlock()
	case leading:
		// Woken to lead as it left: the others in the batch wait for it.
		// (The wake-up may still be on its way: signal drops what a full
		// done cannot take.)
		b.mu.Unlock()
		if len(c.lead) == 1 {
			b.handOff(false)
		} else {
			b.spawn(func() { b.runShared(context.WithoutCancel(ctx), c.lead, nil) })
		}
	default: // batched: answered by its batch, into nothing
		b.mu.Unlock()
	}
	return err
}

// await waits until c is answered or must lead (nil), ctx ends (its error)
// or c.Until passes (context.DeadlineExceeded). ring is the alarm's, armed
// for c.Until (nil, which never closes: no Until).
func (b *Batcher[Q]) await(ctx context.Context, c *Call[Q], ring <-chan struct{}) error {
	for {
		select {
		case <-c.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-ring:
			if !time.Now().Before(c.Until) {
				return context.DeadlineExceeded
			}
			b.mu.Lock() // rung for another call's Until: arm it for this one's
			ring = b.armLocked(c.Until)
			b.mu.Unlock()
		}
	}
}

// armLocked arms the alarm to ring at until or before, and returns the
// channel it closes then (nil for a zero until). b.mu is held.
func (b *Batcher[Q]) armLocked(until time.Time) <-chan struct{} {
	if until.IsZero() {
		return nil
	}
	if b.ring == nil {
		b.ring = make(chan struct{})
	}
	if b.ringAt.IsZero() || until.Before(b.ringAt) {
		b.ringAt = until
		if b.alarm == nil {
			b.rings.Add(1)
			b.alarm = time.AfterFunc(time.Until(until), b.rang)
		} else if !b.alarm.Reset(time.Until(until)) {
			// It had rung (or was stopped): this schedules one more ring.
			// Counted after Reset, safely: a ring takes mu before it ends.
			b.rings.Add(1)
		}
	}
	return b.ring
}

// rang is the alarm's: it wakes every call waiting with an Until. (It may
// ring early, if armed earlier while it was ringing: the calls it wakes
// before their Until arm it again.)
func (b *Batcher[Q]) rang() {
	defer b.rings.Done()
	if b.testRang != nil {
		b.testRang()
	}
	b.mu.Lock()
	if b.ring != nil {
		close(b.ring)
		b.ring = nil
	}
	b.ringAt = time.Time{}
	b.mu.Unlock()
}

// Stop disarms the alarm and waits for a ring under way, so that nothing of
// b's runs after it returns (an alarm armed for a call that was answered
// would otherwise ring up to that call's Until later), and reports whether
// the alarm was set to ring. Call it once no Do runs and none will: its
// owner's Close, past the owner's gate.
func (b *Batcher[Q]) Stop() (armed bool) {
	b.mu.Lock()
	if b.alarm != nil && b.alarm.Stop() { // the ring it held will not come
		b.rings.Done()
		armed = true
	}
	b.ringAt = time.Time{}
	b.mu.Unlock()
	b.rings.Wait()
	return armed
}

// lead runs batch, which self leads: alone in this goroutine, or shared (or
// detached) in a goroutine of its own that self waits for like the others
// (see Do); ring is the alarm's, armed for self.Until.
func (b *Batcher[Q]) lead(ctx context.Context, batch []*Call[Q], self *Call[Q], ring <-chan struct{}) error {
	if len(batch) == 1 && !self.Detached {
		defer b.handOff(false) // a panic in run goes on up this stack
		b.run(ctx, batch)
		return nil
	}
	if self.done == nil {
		self.done = make(chan struct{}, 1)
	}
	self.state = batched
	b.spawn(func() { b.runShared(context.WithoutCancel(ctx), batch, self) })
	if err := b.await(ctx, self, ring); err != nil {
		return err
	}
	if self.panicked != nil {
		panic(self.panicked) // the leader's stack is where a panic of a run of its own would have gone
	}
	return self.err
}

// runShared runs a shared (or detached) batch led by leader (nil: its leader left),
// answers every call in it, and hands its place in flight on. If run
// panics, the leader is handed the panic to raise and the others get
// ErrPanicked; the batcher goes on. It is the goroutine that lead starts
// and it ends here.
func (b *Batcher[Q]) runShared(ctx context.Context, batch []*Call[Q], leader *Call[Q]) {
	defer b.handOff(len(batch) > 1)
	p := b.runRecovering(ctx, batch)
	for _, c := range batch {
		if p != nil {
			c.err = ErrPanicked
			if c == leader {
				c.panicked = p
			}
		}
		signal(c)
	}
}

// runRecovering runs batch and returns what it panicked with, if it did.
func (b *Batcher[Q]) runRecovering(ctx context.Context, batch []*Call[Q]) (p any) {
	defer func() { p = recover() }()
	b.run(ctx, batch)
	return nil
}

// signal tells c that it is answered or must lead. A done that is full
// holds a wake-up to lead that its caller left without reading: nobody
// reads this one either.
func signal[Q any](c *Call[Q]) {
	select {
	case c.done <- struct{}{}:
	default:
	}
}

// takeLocked takes up to max−1 waiting calls and self as a batch: self
// runs it. b.mu is held.
func (b *Batcher[Q]) takeLocked(self *Call[Q]) []*Call[Q] {
	self.state = running
	n := min(len(b.pending), b.max-1)
	if n == 0 { // nobody waits, or a batch holds one call (max 1): not shared
		self.one[0] = self
		return self.one[:]
	}
	b.shared++
	batch := make([]*Call[Q], 0, n+1)
	for _, c := range b.pending[:n] {
		c.state = batched
		batch = append(batch, c)
	}
	b.shiftLocked(n)
	return append(batch, self)
}

// shiftLocked drops the first n waiting calls. b.mu is held.
func (b *Batcher[Q]) shiftLocked(n int) {
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
}

// removeLocked drops c, which waits, from pending. b.mu is held.
func (b *Batcher[Q]) removeLocked(c *Call[Q]) {
	for i, p := range b.pending {
		if p == c {
			copy(b.pending[i:], b.pending[i+1:])
			b.pending[len(b.pending)-1] = nil
			b.pending = b.pending[:len(b.pending)-1]
			return
		}
	}
}

// Hold takes a place in flight without a call, until Release: the calls
// that come meanwhile queue and, once it is given back, run together (a
// caller that knows which requests are coming gathers them so).
func (b *Batcher[Q]) Hold() {
	b.mu.Lock()
	b.inflight++
	b.mu.Unlock()
}

// Release gives back a place taken by Hold: the oldest waiting call leads
// the others (as many as a batch takes) as the next batch.
func (b *Batcher[Q]) Release() { b.handOff(false) }

// handOff passes a batch's place in flight to the oldest waiting call, or
// gives it back; shared says whether the batch had several calls.
func (b *Batcher[Q]) handOff(shared bool) {
	b.mu.Lock()
	b.burst = shared
	if shared {
		b.shared--
	}
	if len(b.pending) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	next := b.pending[0]
	b.shiftLocked(1)
	next.lead = b.takeLocked(next)
	next.state = leading
	b.mu.Unlock()
	signal(next)
}
