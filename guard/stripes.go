package guard

import (
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
