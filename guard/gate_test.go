package guard

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
						runtime.Gosched() // refused: let close and the others run
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

// deep calls itself n times with a frame of about 256 bytes each, as a
// driver's call chain would.
//
//go:noinline
func deep(n int) byte {
	var pad [224]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%len(pad)]
}

// TestGrowKeepsCallsWorking runs a deep call chain after grow in many
// goroutines: the stack grow made is a real one (the calls return what
// they return without it).
func TestGrowKeepsCallsWorking(t *testing.T) {
	want := deep(40)
	var wg sync.WaitGroup
	got := make([]byte, 64)
	for i := range got {
		wg.Go(func() {
			grow()
			got[i] = deep(40)
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != want {
			t.Fatalf("goroutine %d: deep(40) = %d after grow, want %d", i, g, want)
		}
	}
}

// BenchmarkDeepGoroutine starts a goroutine that runs a 10 KB call chain,
// with and without grow first.
func BenchmarkDeepGoroutine(b *testing.B) {
	for _, grown := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "grown"}[grown], func(b *testing.B) {
			done := make(chan byte)
			for b.Loop() {
				go func() {
					if grown {
						grow()
					}
					done <- deep(40)
				}()
				<-done
			}
		})
	}
}
