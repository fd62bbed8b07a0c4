// Package redistest runs the project's tests against a real redis-server.
//
// A test package calls Main from its TestMain; Main starts one private
// redis-server (internal/redisserver) on a unix socket, runs the tests and
// stops the server by PID. Each test then takes a Conn: a fresh go-redis client
// on that server with a Counter hook and a key prefix unique to the test, so
// tests can run in parallel on one server without seeing each other's keys.
//
// With CG_TEST_CLUSTER=1 in the environment, Main starts a real Redis Cluster
// instead (3 masters, 3 replicas, `redis-cli --cluster create`) and every
// Conn is a cluster client: `make test` runs the Redis-facing packages both
// ways.
//
// There is no fake: if redis-server is missing, Main fails loudly and says how
// to install it (`make test` installs it).
package redistest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/cmdcount"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

var (
	server   *redisserver.Server  // set by Main before any test runs, or
	cluster  *redisserver.Cluster // this, in cluster mode
	external []string             // in a child process: "network|addr" or "cluster|addr,addr,..."
	prefixes atomic.Uint64
)

// ClusterMode reports whether the tests run against a Redis Cluster.
func ClusterMode() bool {
	return os.Getenv(envCluster) == "1" || (len(external) > 0 && external[0] == "cluster")
}

// childEnv names the variables a child test process reads.
const (
	envRedis = "CG_TEST_REDIS" // "network|addr" of the parent's server
	envRole  = "CG_TEST_ROLE"  // the child's role
	// envCluster selects cluster mode.
	envCluster = "CG_TEST_CLUSTER"
)

// Main starts a redis-server, runs the package's tests and benchmarks, stops
// the server and exits with the tests' status.
//
// In a child process started by Spawn, Main instead calls roles[role] with
// the parent's server and exits with its status: the tests do not run again.
func Main(m *testing.M, roles ...map[string]func(rdb redis.UniversalClient) int) {
	os.Exit(Run(m, roles...))
}

// Run is Main returning the exit status instead of exiting, for a TestMain
// that has servers of its own to stop afterwards.
func Run(m *testing.M, roles ...map[string]func(rdb redis.UniversalClient) int) int {
	if role := os.Getenv(envRole); role != "" {
		return runChild(role, roles)
	}
	return run(m)
}

// IsChild reports whether this process is a child started by Spawn.
func IsChild() bool { return os.Getenv(envRole) != "" }

func runChild(role string, roles []map[string]func(redis.UniversalClient) int) int {
	network, addr, ok := strings.Cut(os.Getenv(envRedis), "|")
	if !ok {
		fmt.Fprintln(os.Stderr, "redistest: child without", envRedis)
		return 2
	}
	external = []string{network, addr}
	for _, r := range roles {
		if fn := r[role]; fn != nil {
			c := newClient()
			defer c.Close()
			return fn(c)
		}
	}
	fmt.Fprintln(os.Stderr, "redistest: unknown role", role)
	return 2
}

// Child is a test process started by Spawn.
type Child struct {
	Cmd    *exec.Cmd
	Stdout bytes.Buffer // what the child printed; read after Wait
	stderr bytes.Buffer
}

// Spawn starts this test binary again as a child process in role, connected
// to this process's redis-server, with extra "NAME=value" environment. The
// child is killed when the test ends if it is still running.
func Spawn(t testing.TB, role string, env ...string) *Child {
	t.Helper()
	if cluster != nil {
		return spawn(t, "cluster|"+strings.Join(cluster.Addrs(), ","), role, env)
	}
	return SpawnOn(t, Server(t), role, env...)
}

// SpawnOn is Spawn connected to srv (a server of the test's own, see
// Private) instead of the package's.
func SpawnOn(t testing.TB, srv *redisserver.Server, role string, env ...string) *Child {
	t.Helper()
	return spawn(t, srv.Network+"|"+srv.Addr, role, env)
}

func spawn(t testing.TB, target, role string, env []string) *Child {
	t.Helper()
	c := &Child{Cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.Cmd.Env = append(os.Environ(), envRole+"="+role, envRedis+"="+target)
	c.Cmd.Env = append(c.Cmd.Env, env...)
	c.Cmd.Stdout, c.Cmd.Stderr = &c.Stdout, &c.stderr
	if err := c.Cmd.Start(); err != nil {
		t.Fatalf("redistest: spawn %s: %v", role, err)
	}
	t.Cleanup(func() {
		if c.Cmd.ProcessState == nil {
			_ = c.Cmd.Process.Kill()
			_ = c.Cmd.Wait()
		}
	})
	return c
}

// Wait waits for the child and fails the test if it exited with an error
// (unless it was killed on purpose: pass killed=true).
func (c *Child) Wait(t testing.TB, killed bool) {
	t.Helper()
	err := c.Cmd.Wait()
	if err != nil && !killed {
		t.Fatalf("redistest: child %v: %v\nstderr:\n%s", c.Cmd.Env[len(c.Cmd.Env)-1], err, c.stderr.String())
	}
}

func run(m *testing.M) int {
	if ClusterMode() {
		c, err := redisserver.StartCluster(context.Background(), 3, 1)
		if err != nil {
			fmt.Fprintln(os.Stderr, "redistest:", err)
			return 2
		}
		cluster = c
		code := m.Run()
		c.Stop()
		return leakCheck(code)
	}
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
	return leakCheck(code)
}

func leakCheck(code int) int {
	// Every test closes what it opened: no goroutine may outlive the tests.
	if code == 0 {
		// go-redis probes a dead server from a goroutine of its pool that
		// sleeps a second between dials and returns at its next wake once
		// the pool is closed: a test that killed a server can end inside
		// that second. It is go-redis's, and it ends by itself.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err != nil {
			fmt.Fprintln(os.Stderr, "redistest: goroutines left behind:", err)
			return 3
		}
	}
	return code
}

// Server returns the running standalone server; it fails the test if Main
// did not start one (or started a cluster).
func Server(t testing.TB) *redisserver.Server {
	t.Helper()
	if server == nil {
		t.Fatal("redistest: no standalone redis-server; call redistest.Main from TestMain")
	}
	return server
}

// newClient returns a client on whatever Main started (or the parent's, in a
// child process).
func newClient() redis.UniversalClient {
	switch {
	case len(external) == 2 && external[0] == "cluster":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(external[1], ",")})
	case len(external) == 2:
		return redis.NewClient(&redis.Options{Network: external[0], Addr: external[1]})
	case cluster != nil:
		return redis.NewClusterClient(cluster.Options())
	case server != nil:
		return redis.NewClient(server.Options())
	}
	panic("redistest: no redis-server; call redistest.Main from TestMain")
}

// NewClient returns a new client on the test server (a cluster client in
// cluster mode), for examples that build their own; the caller closes it.
// In an application: redis.NewClient(&redis.Options{Addr: "localhost:6379"}).
func NewClient() redis.UniversalClient { return newClient() }

// Conn is a test's view of the server.
type Conn struct {
	redis.UniversalClient
	// Counter counts what this client sends.
	Counter *Counter
	// Prefix is unique to the test; use it as a key prefix.
	Prefix string
}

// ForEachMaster runs fn on every master (on the one server, standalone),
// as a *redis.ClusterClient does: code that scans every master sees this
// Conn as the cluster it wraps.
func (c *Conn) ForEachMaster(ctx context.Context, fn func(ctx context.Context, n *redis.Client) error) error {
	if cc, ok := c.UniversalClient.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, fn)
	}
	return fn(ctx, c.UniversalClient.(*redis.Client))
}

// Connect returns a new client on the server, closed when the test ends. The
// client has answered a PING before the counter is reset, so the connection
// hand-shake is not counted (a second connection dialed later would be).
func Connect(t testing.TB) *Conn {
	t.Helper()
	if server == nil && cluster == nil {
		t.Fatal("redistest: no redis-server; call redistest.Main from TestMain")
	}
	c := newClient()
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: ping: %v", err)
	}
	if cc, ok := c.(*redis.ClusterClient); ok { // learn the slots before counting
		if err := cc.ForEachShard(context.Background(), func(ctx context.Context, n *redis.Client) error {
			return n.Ping(ctx).Err()
		}); err != nil {
			t.Fatalf("redistest: ping shards: %v", err)
		}
	}
	ctr := &Counter{}
	c.AddHook(ctr)
	// A connection dialed after AddHook sends its hand-shake (HELLO, CLIENT
	// SETINFO) through the hook: dial one now and start counting after it.
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: ping: %v", err)
	}
	ctr.Reset()
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return &Conn{UniversalClient: c, Counter: ctr, Prefix: fmt.Sprintf("t%d.%s", prefixes.Add(1), name)}
}

// AllKeys returns the keys matching pattern on every master (KEYS on one node
// would miss the others' in a cluster).
func (c *Conn) AllKeys(ctx context.Context, pattern string) ([]string, error) {
	var out []string
	var mu sync.Mutex
	each := func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, pattern).Result()
		mu.Lock()
		out = append(out, keys...)
		mu.Unlock()
		return err
	}
	if cc, ok := c.UniversalClient.(*redis.ClusterClient); ok {
		return out, cc.ForEachMaster(ctx, each)
	}
	return out, each(ctx, c.UniversalClient.(*redis.Client))
}

// DropOwn deletes every key under c.Prefix, on every master: what a test
// that uses only its own keys sees when Redis loses everything, without
// touching the keys of the tests that run beside it.
func (c *Conn) DropOwn(ctx context.Context) error {
	keys, err := c.AllKeys(ctx, c.Prefix+"*")
	if err != nil {
		return err
	}
	for _, k := range keys { // one by one: in a cluster they are in many slots
		if err := c.Del(ctx, k).Err(); err != nil {
			return err
		}
	}
	return nil
}

// FlushMasters empties every master.
func (c *Conn) FlushMasters(ctx context.Context) error {
	if cc, ok := c.UniversalClient.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.FlushDB(ctx).Err() })
	}
	return c.UniversalClient.FlushDB(ctx).Err()
}

// Counter counts round trips and commands (see internal/cmdcount).
type Counter = cmdcount.Counter

// ConnectAs returns a new client on the server that authenticates as an ACL
// user (create it first, on every node: see ForEachNode), closed when the
// test ends. It has no Counter; it is set up as README's client is
// (ContextTimeoutEnabled, DialerRetries 1).
func ConnectAs(t testing.TB, user, password string) redis.UniversalClient {
	t.Helper()
	var c redis.UniversalClient
	switch {
	case cluster != nil:
		o := cluster.Options()
		o.Username, o.Password = user, password
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1
		c = redis.NewClusterClient(o)
	case server != nil:
		o := server.Options()
		o.Username, o.Password = user, password
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1
		c = redis.NewClient(o)
	default:
		t.Fatal("redistest: no redis-server; call redistest.Main from TestMain")
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ForEachNode runs fn on every node (masters and replicas in a cluster; the
// one server otherwise): for per-node settings such as ACL users.
func (c *Conn) ForEachNode(ctx context.Context, fn func(ctx context.Context, n *redis.Client) error) error {
	if cc, ok := c.UniversalClient.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, fn)
	}
	return fn(ctx, c.UniversalClient.(*redis.Client))
}

// Private starts a standalone redis-server of the test's own (to kill, freeze
// or reconfigure without disturbing other tests) and returns it with a client
// that does not retry (MaxRetries -1), so a failure shows at once. Both are
// stopped when the test ends.
func Private(t testing.TB) (*redisserver.Server, *redis.Client) {
	t.Helper()
	srv, err := redisserver.Start(context.Background(), nil)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	o := srv.Options()
	o.MaxRetries = -1
	rdb := redis.NewClient(o)
	t.Cleanup(func() {
		_ = rdb.Close()
		_ = srv.Stop()
	})
	return srv, rdb
}

// Logs is a log sink a test reads while the code under test (its
// goroutines, go-redis's process-wide logger) still writes to it.
type Logs struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ACLUser creates, on every node, a user limited to prefix's keys and
// channels and to cmds (keyspace.ACLService and its kin; on a cluster
// keyspace.ACLCluster too), deleted when the test ends, and returns a
// client logged in as it (ConnectAs).
func (c *Conn) ACLUser(t testing.TB, user, prefix, cmds string) redis.UniversalClient {
	t.Helper()
	ctx := context.Background()
	if ClusterMode() {
		cmds += " " + keyspace.ACLCluster
	}
	if err := c.ForEachNode(ctx, func(ctx context.Context, n *redis.Client) error {
		return SetUser(ctx, n, user, prefix, cmds)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.ForEachNode(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.Do(ctx, "ACL", "DELUSER", user).Err()
		})
	})
	return ConnectAs(t, user, "secret")
}

// SetUser creates user (password "secret") on the node n, limited to
// prefix's keys and channels and to cmds (keyspace.ACLRule).
func SetUser(ctx context.Context, n *redis.Client, user, prefix, cmds string) error {
	rule := []any{"ACL", "SETUSER", user, "reset", "on", ">secret"}
	for _, r := range keyspace.ACLRule(prefix, cmds) {
		rule = append(rule, r)
	}
	return n.Do(ctx, rule...).Err()
}

// Refused lists what every node's ACL LOG holds of user's (RefusedOn).
func (c *Conn) Refused(t testing.TB, user string) []string {
	t.Helper()
	var out []string
	var mu sync.Mutex
	if err := c.ForEachNode(context.Background(), func(ctx context.Context, n *redis.Client) error {
		r, err := RefusedOn(ctx, n, user)
		mu.Lock()
		out = append(out, r...)
		mu.Unlock()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// RefusedOn lists what n's ACL LOG holds of user's NOPERM refusals: each
// as "reason object (count)", the object a command, a key or a channel
// (failed logins, reason "auth", are not refusals).
func RefusedOn(ctx context.Context, n *redis.Client, user string) ([]string, error) {
	entries, err := n.ACLLog(ctx, 1000).Result()
	var out []string
	for _, e := range entries {
		if e.Username == user && e.Reason != "auth" {
			out = append(out, fmt.Sprintf("%s %s (%d)", e.Reason, e.Object, e.Count))
		}
	}
	return out, err
}
