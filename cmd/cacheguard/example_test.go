package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// exampleURL is the REDIS_URL of the server TestMain starts for the
// examples (the tests start their own).
var exampleURL string

func TestMain(m *testing.M) {
	port, err := redisserver.FreePort(false)
	if err == nil {
		var srv *redisserver.Server
		if srv, err = redisserver.Start(context.Background(), &redisserver.Options{Port: port}); err == nil {
			exampleURL = "redis://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			code := m.Run()
			_ = srv.Stop()
			os.Exit(code)
		}
	}
	fmt.Fprintln(os.Stderr, "cacheguard tests: cannot start redis-server:", err)
	os.Exit(1)
}

// Example_rebuildAndCheck is a session at a shell, with REDIS_URL set:
//
//	$ cacheguard -name product rebuild ids.txt
//	$ cacheguard -name product check 42
//	$ cacheguard -name product check 7
func Example_rebuildAndCheck() {
	env := func(k string) string {
		if k == "REDIS_URL" {
			return exampleURL
		}
		return ""
	}
	ctx, ids := context.Background(), strings.NewReader("41\n42\n43\n")
	var discard strings.Builder
	code := run(ctx, []string{"-name", "example", "-progress", "none", "rebuild"}, env, ids, &discard, &discard)
	fmt.Println("rebuild exit", code)
	code = run(ctx, []string{"-name", "example", "check", "42"}, env, nil, os.Stdout, os.Stdout)
	fmt.Println("exit", code)
	code = run(ctx, []string{"-name", "example", "check", "7"}, env, nil, os.Stdout, &discard)
	fmt.Println("exit", code)
	// Output:
	// rebuild exit 0
	// 42: filter says may exist; cache holds nothing
	// exit 0
	// 7: filter says absent; cache holds nothing
	// exit 3
}
