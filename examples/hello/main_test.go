package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

var addr string // the test's redis-server, started by TestMain

func TestMain(m *testing.M) {
	port, err := redisserver.FreePort(false)
	if err == nil {
		var srv *redisserver.Server
		if srv, err = redisserver.Start(context.Background(), &redisserver.Options{Port: port}); err == nil {
			addr = srv.Addr
			code := m.Run()
			_ = srv.Stop()
			os.Exit(code)
		}
	}
	fmt.Fprintln(os.Stderr, "hello:", err)
	os.Exit(1)
}

// Example_run runs the README's example against a private redis-server.
func Example_run() {
	if err := run(context.Background(), addr); err != nil {
		fmt.Println(err)
	}
	// Output:
	// Desk lamp <nil>
	// true
	// 1 200
	// 2 404
	// 3 200
	// 999 404
}

// TestREADMEShowsThisFile: the README's example is this program, to the
// byte, so it cannot drift from what runs here.
func TestREADMEShowsThisFile(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(src)+"```\n") {
		t.Fatal("README.md does not show examples/hello/main.go as it is")
	}
}
