package redisfail_test

import (
	"errors"
	"fmt"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

func ExampleWrap() {
	err := redisfail.Wrap(errors.New("OOM command not allowed when used memory > 'maxmemory'"))
	fmt.Println(errors.Is(err, redisfail.ErrUnavailable))
	fmt.Println(err)
	// Output:
	// true
	// cacheguard: redis unavailable: OOM command not allowed when used memory > 'maxmemory'
}
