package backoff_test

import (
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/backoff"
)

func Example() {
	b := backoff.New(100*time.Millisecond, time.Second, false)
	for range 5 {
		fmt.Print(b.Pause(0), " ")
	}
	// Output: 100ms 200ms 400ms 800ms 1s
}
