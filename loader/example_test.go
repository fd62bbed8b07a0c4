package loader_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/loader"
)

func ExampleGroup() {
	g := loader.Group[string, string]{Timeout: time.Second}
	var loads atomic.Int32
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, _, _ := g.Do(context.Background(), "user:42", func(ctx context.Context) (string, error) {
				loads.Add(1)
				time.Sleep(50 * time.Millisecond) // a slow query; the others join it
				return "Ada", nil
			})
			_ = v
		}()
	}
	wg.Wait()
	fmt.Println("loads:", loads.Load())
	// Output: loads: 1
}

// A panicking load reaches every caller as an error wrapping ErrPanic.
func ExampleGroup_Do() {
	var g loader.Group[string, int]
	_, _, err := g.Do(context.Background(), "k", func(ctx context.Context) (int, error) { panic("boom") })
	fmt.Println(errors.Is(err, loader.ErrPanic))
	// Output: true
}

// Forget lets the next caller start a new flight while one is under way
// (after a write, say, so that nobody takes the older flight's answer).
func ExampleGroup_Forget() {
	var g loader.Group[string, int]
	started, release := make(chan struct{}), make(chan struct{})
	go g.Do(context.Background(), "k", func(ctx context.Context) (int, error) {
		close(started)
		<-release
		return 1, nil
	})
	<-started
	g.Forget("k")
	v, _, _ := g.Do(context.Background(), "k", func(ctx context.Context) (int, error) { return 2, nil })
	close(release)
	fmt.Println(v)
	// Output: 2
}
