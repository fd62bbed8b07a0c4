package guard

import (
	"math/rand/v2"
	"sync/atomic"
)

// stripes is a number spread over cache lines: each update goes to one
// stripe (pick one at random per call) and sum adds them up. Under parallel
// Gets, one shared word bounced between cores on every call: the close
// gate's count of calls inside was the most contended word of a local hit.
// The gate adds and takes back on the stripe a call entered on; the hit
// counters (striped) add on any.
type stripes struct {
	s [numStripes]struct {
		n atomic.Int64
		_ [56]byte // a cache line each
	}
}

const numStripes = 16

// pick returns a stripe for this call (math/rand/v2's per-thread source:
// no shared state).
func (s *stripes) pick() int { return int(rand.Uint32() % numStripes) }

func (s *stripes) add(i int, d int64) { s.s[i].n.Add(d) }

// sum is exact once every add has returned.
func (s *stripes) sum() int64 {
	var n int64
	for i := range s.s {
		n += s.s[i].n.Load()
	}
	return n
}
