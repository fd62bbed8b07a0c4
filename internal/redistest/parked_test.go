package redistest_test

import (
	"sync"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// waitHere and waitThere are where the goroutines of TestParked wait.
//
//go:noinline
func waitHere(ch chan struct{}) { <-ch }

//go:noinline
func waitThere(ch chan struct{}) { <-ch }

// startAndWait starts a goroutine that waits in waitHere, and waits for it.
func startAndWait(ch chan struct{}) {
	var inner sync.WaitGroup
	inner.Go(func() { waitHere(ch) })
	inner.Wait()
}

// TestParked: Parked counts the test's own goroutines waiting in the named
// function, those started by its goroutines too (while they live), and
// neither the goroutines of another root nor those waiting elsewhere.
func TestParked(t *testing.T) {
	root := redistest.GoID()
	release := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for range 3 {
		wg.Go(func() { waitHere(release) })
	}
	wg.Go(func() { waitThere(release) })
	wg.Go(func() { startAndWait(release) }) // a child's child counts while the child lives
	other := make(chan int)
	go func() { // another root: started by a goroutine the test did not start
		go func() { other <- redistest.GoID(); waitHere(release) }()
	}()
	otherRoot := <-other
	redistest.WaitParked(t, 4, "redistest_test.waitHere", "")
	if n := redistest.Parked(root, "redistest_test.waitHere", ""); n != 4 {
		t.Fatalf("Parked = %d, want 4 (3 goroutines and a child's child)", n)
	}
	if n := redistest.Parked(root, "redistest_test.waitHere", "redistest_test.startAndWait"); n != 1 {
		t.Fatalf("Parked within startAndWait = %d, want 1 (the child's child)", n)
	}
	if n := redistest.Parked(root, "redistest_test.waitThere", ""); n != 1 {
		t.Fatalf("Parked in waitThere = %d, want 1", n)
	}
	if n := redistest.Parked(otherRoot, "redistest_test.waitHere", ""); n != 0 {
		t.Fatalf("Parked under another root = %d, want 0", n)
	}
}
