package pgserver_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cacheguard/cacheguard/internal/pgserver"
)

// TestMain checks first for PostgreSQL: without it, one line says what to
// install instead of the example's mismatched output.
func TestMain(m *testing.M) {
	if err := pgserver.Installed(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

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
