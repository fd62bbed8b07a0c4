package growstack_test

import (
	"sync"
	"testing"

	"github.com/cacheguard/cacheguard/internal/growstack"
)

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

// TestGrowKeepsCallsWorking runs a deep call chain after Grow in many
// goroutines: the stack Grow made is a real one (the calls return what
// they return without it).
func TestGrowKeepsCallsWorking(t *testing.T) {
	want := deep(40)
	var wg sync.WaitGroup
	got := make([]byte, 64)
	for i := range got {
		wg.Go(func() {
			growstack.Grow()
			got[i] = deep(40)
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != want {
			t.Fatalf("goroutine %d: deep(40) = %d after Grow, want %d", i, g, want)
		}
	}
}

// BenchmarkDeepGoroutine starts a goroutine that runs a 10 KB call chain,
// with and without Grow first.
func BenchmarkDeepGoroutine(b *testing.B) {
	for _, tc := range []struct {
		name string
		grow bool
	}{{"plain", false}, {"grown", true}} {
		b.Run(tc.name, func(b *testing.B) {
			done := make(chan byte)
			for b.Loop() {
				go func() {
					if tc.grow {
						growstack.Grow()
					}
					done <- deep(40)
				}()
				<-done
			}
		})
	}
}
