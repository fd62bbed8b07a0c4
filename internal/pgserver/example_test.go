package pgserver_test

import (
	"fmt"
	"strings"

	"github.com/cacheguard/cacheguard/internal/pgserver"
)

// A private server with logical decoding on, removed at the end.
func Example() {
	s, err := pgserver.Start("wal_level=logical")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Remove()
	fmt.Println(strings.HasPrefix(s.URL("postgres"), "postgres://postgres@127.0.0.1:"))
	fmt.Println(s.Restart())
	// Output:
	// true
	// <nil>
}
