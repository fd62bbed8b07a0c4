package guard

import (
	"context"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The supervisor: every goroutine and flight of a Guard runs under it,
// and every entry point that reaches Redis passes its gate, so Close stops
// them all and waits for them: nothing a Guard started outlives its Close.

// supervisor owns every goroutine a Guard starts: each runs through goRun
// or goLoop on the supervisor's ctx, which stop cancels before it waits for
// all of them. A goRun goroutine started before Close passes the gate for
// its whole run, like a call, so Close's wait for the gate waits for it too;
// one started later (by a call still inside), and a goLoop goroutine (a
// loop that waits for Redis), run outside it, until stop. After stop
// begins, neither starts (they report false).
type supervisor struct {
	gate                     // every entry point, flight and goRun goroutine passes it; close shuts it before stop
	ctx      context.Context // the Guard's own: New's values, not its cancellation; cancelled by stop
	cancel   context.CancelFunc
	bg       context.Context // ctx's, for work nobody waits for (a refresh ahead): cancelled as Close begins
	cancelBg context.CancelFunc
	wg       sync.WaitGroup // one per goroutine

	mu      sync.Mutex // orders wg.Add before stop's Wait
	stopped bool       // stop has begun: add refuses
}

func newSupervisor(ctx context.Context) *supervisor {
	s := &supervisor{}
	s.gate.drained, s.gate.left = make(chan struct{}), make(chan struct{}, 1)
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.bg, s.cancelBg = context.WithCancel(s.ctx)
	return s
}

// goRun runs fn in a goroutine of the supervisor's on its ctx, inside the
// gate unless Close has shut it, and reports whether it did (not once stop
// has begun).
func (s *supervisor) goRun(fn func(ctx context.Context)) bool {
	pass, err := s.enter()
	if err != nil { // Close has begun: a call still inside started it
		return s.goLoop(fn)
	}
	if !s.add() {
		s.leave(pass)
		return false
	}
	go func() {
		defer s.wg.Done()
		defer s.leave(pass)
		grow() // its work makes deep calls (go-redis, the load): see grow
		fn(s.ctx)
	}()
	return true
}

// goLoop runs fn, a loop that waits for Redis (retry), in a goroutine of
// the supervisor's on its ctx, outside the gate, and reports whether it did
// (not once stop has begun).
func (s *supervisor) goLoop(fn func(ctx context.Context)) bool {
	if !s.add() {
		return false
	}
	go func() {
		defer s.wg.Done()
		grow()
		fn(s.ctx)
	}()
	return true
}

// add counts one more goroutine, unless stop has begun.
func (s *supervisor) add() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.wg.Add(1)
	return true
}

// spawn is goRun for work that must run whatever happens (a shared round
// trip that callers wait for): after stop it runs fn in the caller's
// goroutine instead.
func (s *supervisor) spawn(fn func()) {
	if !s.goRun(func(context.Context) { fn() }) {
		fn()
	}
}

// close shuts the gate (new calls get ErrClosed), waits for the calls
// inside, then stops: no call is left to start a goroutine.
func (s *supervisor) close() {
	s.cancelBg()
	s.gate.close()
	s.stop()
}

// stop cancels the supervisor's ctx and waits for every goroutine.
func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// growFrame is grow's frame: with the caller's frames and the stack guard
// on top, the runtime grows a 2 KB stack straight to 16 KB, the largest size
// its per-P cache of free stacks keeps.
const growFrame = 12 << 10

// grow grows a new goroutine's stack to 16 KB in one copy of one small
// frame, before deep calls (a go-redis pipeline, a database driver) would
// make the runtime double it two or three times, copying a deep stack each
// time (CockroachDB's pkg/util/growstack; docs/benchmarks.md has the
// figures). Every goroutine of the supervisor's runs it first.
//
//go:noinline
func grow() {
	var buf [growFrame]byte
	keepFrame(buf[:])
}

// keepFrame keeps buf, and so grow's frame, from being optimised away.
//
//go:noinline
func keepFrame([]byte) {}

// gate lets calls in until it is closed, then waits for those inside. Every
// exported entry point and every flight passes it (enter, then leave with
// the pass enter gave). Calls inside are counted on stripes, one cache line
// each (see pick): one atomic add on the way in and one on the way out, on
// a line that two cores rarely share. A call leaves on the stripe it
// entered, so no stripe goes negative and a stripe's count is exact.
//
// Close sets closed, then sums the stripes until they read zero, woken by
// each leave that sees closed. A call that entered before closed was set is
// seen by that sum (its add precedes its read of closed, which precedes the
// store, which precedes the sum's read); a call that enters after sees
// closed and leaves at once.
type gate struct {
	inside  stripes // calls inside, each counted on the stripe it entered on
	closed  atomic.Bool
	left    chan struct{} // made by New, buffer 1: a call left after closed was set
	once    sync.Once     // closes drained
	drained chan struct{} // made by New; closed once the gate is closed and empty
}

// gatePass is the stripe a call entered on.
type gatePass uint32

// enter lets a call in, or reports ErrClosed. A call let in must leave with
// the pass.
func (gt *gate) enter() (gatePass, error) {
	p := gatePass(gt.inside.pick())
	gt.inside.add(int(p), 1)
	if gt.closed.Load() {
		gt.leave(p)
		return 0, ErrClosed
	}
	return p, nil
}

func (gt *gate) leave(p gatePass) {
	gt.inside.add(int(p), -1)
	if gt.closed.Load() {
		select {
		case gt.left <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// close refuses new calls and waits for the calls inside to leave. Several
// callers may close; all return once the gate is empty.
func (gt *gate) close() {
	gt.closed.Store(true)
	gt.once.Do(func() {
		for gt.inside.sum() != 0 {
			<-gt.left
		}
		close(gt.drained)
	})
	<-gt.drained
}

// stripes is a number spread over cache lines, so that parallel calls do
// not bounce one word between cores: each update goes to one stripe and sum
// adds them up. The gate adds and takes back on the stripe a call entered
// on; the hit counters add on any (inc).
type stripes struct {
	s [numStripes]struct {
		n       atomic.Int64
		yielded atomic.Int64 // when a caller on this stripe last yielded (pace)
		_       [48]byte     // a cache line each
	}
}

const (
	stripeBits = 4
	numStripes = 1 << stripeBits
)

// pick returns a stripe for this call, derived from the address of the
// calling goroutine's stack: a goroutine keeps adding on the same stripe
// (its cache line stays with its core), and goroutines mostly land on
// different ones. The address is only hashed; a stack that moves just
// picks another stripe.
func (s *stripes) pick() int {
	var onStack byte
	a := uint64(uintptr(unsafe.Pointer(&onStack))) >> 10      // stacks are at least 2 KiB apart
	return int((a * 0x9e3779b97f4a7c15) >> (64 - stripeBits)) // Fibonacci hashing onto the stripes
}

func (s *stripes) add(i int, d int64) { s.s[i].n.Add(d) }

// inc counts one on this call's stripe; load is exact once the incs have
// returned.
func (s *stripes) inc()         { s.add(s.pick(), 1) }
func (s *stripes) load() uint64 { return uint64(s.sum()) }

// pace yields the processor if goroutines wait for one and this caller's
// stripe last looked yieldPeriod before now, a clock reading (or the clock
// went back): the local hits' stripes pace the hits (see yieldPeriod), on
// the line each hit counts on. With nobody waiting, a yield could leave a
// processor idle.
func (s *stripes) pace(now int64) {
	p := &s.s[s.pick()].yielded
	if last := p.Load(); (now-last >= yieldPeriod || now < last) && p.CompareAndSwap(last, now) && othersRunnable() {
		yield()
	}
}

// yield is runtime.Gosched, but in tests that count the yields.
var yield = runtime.Gosched

// othersRunnable reports whether goroutines are waiting for a processor
// (about 50 ns: runtime/metrics).
func othersRunnable() bool {
	s := [1]metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	metrics.Read(s[:])
	return s[0].Value.Kind() == metrics.KindUint64 && s[0].Value.Uint64() > 0
}

// sum is exact once every add has returned.
func (s *stripes) sum() int64 {
	var n int64
	for i := range s.s {
		n += s.s[i].n.Load()
	}
	return n
}
