// Package redistest runs the project's tests against a real redis-server.
//
// A test package calls Main from its TestMain; Main starts one private
// redis-server (internal/redisserver) on a unix socket, runs the tests and
// stops the server by PID. Each test then takes a Conn: a fresh go-redis client
// on that server with a Counter hook and a key prefix unique to the test, so
// tests can run in parallel on one server without seeing each other's keys.
//
// There is no fake: if redis-server is missing, Main fails loudly and says how
// to install it (`make test` installs it).
package redistest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

var (
	server   *redisserver.Server // set by Main before any test runs
	prefixes atomic.Uint64
)

// Main starts a redis-server, runs the package's tests and benchmarks, stops
// the server and exits with the tests' status.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	s, err := redisserver.Start(context.Background(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 2
	}
	server = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 2
	}
	// Every test closes what it opened: no goroutine may outlive the tests.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "redistest: goroutines left behind:", err)
			return 3
		}
	}
	return code
}

// Options returns go-redis options that dial the running server, for examples
// that build their own client (in an application: &redis.Options{Addr: ...}).
func Options() *redis.Options {
	if server == nil {
		panic("redistest: no redis-server; call redistest.Main from TestMain")
	}
	return server.Options()
}

// Server returns the running server; it fails the test if Main did not start one.
func Server(t testing.TB) *redisserver.Server {
	t.Helper()
	if server == nil {
		t.Fatal("redistest: no redis-server; call redistest.Main from TestMain")
	}
	return server
}

// Conn is a test's view of the server.
type Conn struct {
	*redis.Client
	// Counter counts what this client sends.
	Counter *Counter
	// Prefix is unique to the test; use it as a key prefix.
	Prefix string
}

// Connect returns a new client on the server, closed when the test ends. The
// client has answered a PING before the counter is reset, so the connection
// hand-shake is not counted.
func Connect(t testing.TB) *Conn {
	t.Helper()
	s := Server(t)
	c := redis.NewClient(s.Options())
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: ping: %v", err)
	}
	ctr := &Counter{}
	c.AddHook(ctr)
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return &Conn{Client: c, Counter: ctr, Prefix: fmt.Sprintf("t%d.%s", prefixes.Add(1), name)}
}

// Counter is a redis.Hook that counts round trips (a single command or a whole
// pipeline is one) and commands, and remembers command names.
type Counter struct {
	trips, cmds atomic.Int64
	mu          sync.Mutex // guards names
	names       map[string]int
}

// RoundTrips is the number of round trips since the last Reset.
func (c *Counter) RoundTrips() int64 { return c.trips.Load() }

// Commands is the number of commands since the last Reset.
func (c *Counter) Commands() int64 { return c.cmds.Load() }

// Names returns how often each command name was sent since the last Reset.
func (c *Counter) Names() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.names))
	for k, v := range c.names {
		out[k] = v
	}
	return out
}

// Reset zeroes the counts.
func (c *Counter) Reset() {
	c.trips.Store(0)
	c.cmds.Store(0)
	c.mu.Lock()
	c.names = nil
	c.mu.Unlock()
}

func (c *Counter) note(cmds []redis.Cmder) {
	c.trips.Add(1)
	c.cmds.Add(int64(len(cmds)))
	c.mu.Lock()
	if c.names == nil {
		c.names = map[string]int{}
	}
	for _, cmd := range cmds {
		c.names[cmd.Name()]++
	}
	c.mu.Unlock()
}

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.note([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.note(cmds)
		return next(ctx, cmds)
	}
}
