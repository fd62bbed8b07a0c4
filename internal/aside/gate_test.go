package aside

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// The gate is pure logic: no Redis. Close must not return while a call that
// entered before it is inside, and no call may enter after it.
func TestGateCloseWaitsForEveryCallInside(t *testing.T) {
	for round := range 30 {
		gt := gate{drained: make(chan struct{}), left: make(chan struct{}, 1)}
		var inside atomic.Int64 // calls between a successful enter and their leave
		var admittedAfterClose atomic.Int64
		closed := make(chan struct{})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { // owned by this round; ends when stop is closed
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					p, err := gt.enter()
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("enter: %v", err)
						}
						continue
					}
					select {
					case <-closed:
						admittedAfterClose.Add(1)
					default:
					}
					inside.Add(1)
					runtime.Gosched() // stay inside a while
					inside.Add(-1)
					gt.leave(p)
				}
			}()
		}
		gt.close()
		close(closed)
		if n := inside.Load(); n != 0 {
			t.Fatalf("round %d: close returned with %d calls inside", round, n)
		}
		gt.close() // a second Close returns too
		close(stop)
		wg.Wait()
		if n := admittedAfterClose.Load(); n != 0 {
			t.Fatalf("round %d: %d calls entered after close returned", round, n)
		}
		if n := gt.inside.sum(); n != 0 {
			t.Fatalf("round %d: the stripes sum to %d after every call left", round, n)
		}
	}
}
