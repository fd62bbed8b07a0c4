package growstack_test

import (
	"fmt"
	"strings"

	"github.com/cacheguard/cacheguard/internal/growstack"
)

func Example() {
	done := make(chan string)
	go func() {
		growstack.Grow() // first: the calls below then run without growing the stack
		done <- strings.Repeat("deep ", 3)
	}()
	fmt.Println(<-done)
	// Output: deep deep deep
}
