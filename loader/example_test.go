package loader_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/loader"
)

func ExampleGroup() {
	g := loader.Group[string]{Timeout: time.Second}
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
