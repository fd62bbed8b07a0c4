package aside

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// stripes is a number spread over cache lines: each update goes to one
// stripe and sum adds them up. Under parallel Gets, one shared word bounced
// between cores on every call: the close gate's count of calls inside was
// the most contended word of a local hit. The gate adds and takes back on
// the stripe a call entered on; the hit counters (striped) add on any.
type stripes struct {
	s [numStripes]struct {
		n atomic.Int64
		_ [56]byte // a cache line each
	}
}

const (
	stripeBits = 4
	numStripes = 1 << stripeBits
)

// pick returns a stripe for this call: one derived from the address of the
// calling goroutine's stack, so that a goroutine keeps adding on the same
// stripe (its cache line stays with the core that runs it) and goroutines
// with stacks of their own mostly land on different ones. A random stripe
// per call moved the line between cores about every other add. The
// address is only hashed, never turned back into a pointer; a stack that
// grows and moves just picks another stripe.
func (s *stripes) pick() int {
	var onStack byte
	a := uint64(uintptr(unsafe.Pointer(&onStack))) >> 10      // stacks are at least 2 KiB apart
	return int((a * 0x9e3779b97f4a7c15) >> (64 - stripeBits)) // Fibonacci hashing onto the stripes
}

func (s *stripes) add(i int, d int64) { s.s[i].n.Add(d) }

// sum is exact once every add has returned.
func (s *stripes) sum() int64 {
	var n int64
	for i := range s.s {
		n += s.s[i].n.Load()
	}
	return n
}

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
