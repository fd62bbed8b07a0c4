package guard_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestErrUnavailableFromEveryOperation: with Redis killed, every exported
// operation of a Guard returns an error wrapping ErrUnavailable (Get under
// the fail-fast outage policy), so that callers need one errors.Is branch;
// none says ErrNotFound. New itself works without Redis, and the operations
// of the Guard it returns report ErrUnavailable alike.
func TestErrUnavailableFromEveryOperation(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	failFast := &guard.Options{Outage: &guard.OutageOptions{FailFast: true}}
	srv, rdb, g := privateGuard(t, failFast)
	d := newDB(10)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	g2, err := guard.New(ctx, rdb, "other", failFast)
	if err != nil {
		t.Fatalf("New with Redis down: %v (a Guard must start without Redis)", err)
	}
	defer g2.Close()
	ops := map[string]func() error{
		"Add on a Guard made while Redis was down": func() error { return g2.Add(ctx, "p1") },
		"Get on a Guard made while Redis was down": func() error { _, err := guard.Get(ctx, g2, "p1", d.load); return err },
		"Get":         func() error { _, err := guard.Get(ctx, g, "p1", d.load); return err },
		"Get unknown": func() error { _, err := guard.Get(ctx, g, "nope", d.load); return err },
		"Peek":        func() error { _, _, err := g.Peek(ctx, "p1"); return err },
		"MayExist":    func() error { _, err := g.MayExist(ctx, "p1"); return err },
		"Add":         func() error { return g.Add(ctx, "p11") },
		"Invalidate":  func() error { return g.Invalidate(ctx, "p1") },
		"Rebuild":     func() error { _, err := g.Rebuild(ctx, ids("p", 10), nil); return err },
		"Info":        func() error { _, err := g.Info(ctx); return err },
	}
	names := make([]string, 0, len(ops))
	for name := range ops {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		err := ops[name]()
		if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, guard.ErrNotFound) {
			t.Errorf("%s with Redis down: err = %v, want one wrapping ErrUnavailable", name, err)
		}
	}
	if d.calls.Load() != 0 {
		t.Fatalf("loader called %d times with Redis down", d.calls.Load())
	}
	// Each failed operation on g is counted once.
	if st := g.Stats(); st.RedisErrors != uint64(len(ops)-2) {
		t.Fatalf("RedisErrors = %d after %d failed operations, want one each", st.RedisErrors, len(ops)-2)
	}
}

// TestErrUnavailableWhenRedisRefusesWrites: a Redis that refuses writes
// (maxmemory reached under noeviction) is unavailable too.
func TestErrUnavailableWhenRedisRefusesWrites(t *testing.T) {
	ctx := context.Background()
	_, rdb := redistest.Private(t)
	g, err := guard.New(ctx, rdb, "product", &guard.Options{Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.ConfigSet(ctx, "maxmemory", "0")
	if err := g.Add(ctx, "p1"); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Add under maxmemory: %v, want ErrUnavailable", err)
	}
	if err := g.Invalidate(ctx, "p1"); err != nil && !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Invalidate under maxmemory: %v", err)
	}
}

// aclCommands is every command a Guard sends, directly or from its scripts:
// the least-privilege user of README's "Redis ACL" section.
var aclCommands = strings.Fields(
	"bitfield bitop del eval evalsha exists get getrange hdel hexists hget hgetall hincrby hkeys hset incr scan " +
		"pexpire pttl publish script|load set setrange subscribe time unlink bitcount getbit " +
		"memory|usage",
)

// aclUser creates (on every node) a user limited to keys and channels under
// prefix and to aclCommands, and returns a client logged in as that user.
func aclUser(t *testing.T, c *redistest.Conn, user, prefix string) redis.UniversalClient {
	t.Helper()
	ctx := context.Background()
	rule := []any{"ACL", "SETUSER", user, "reset", "on", ">secret", "~" + prefix + ":*", "&" + prefix + ":*", "-@all"}
	cmds := aclCommands
	if redistest.ClusterMode() { // a cluster client reads the slot map
		cmds = append(cmds[:len(cmds):len(cmds)], "cluster|slots")
	}
	for _, cmd := range cmds {
		rule = append(rule, "+"+cmd)
	}
	if err := c.ForEachNode(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Do(ctx, rule...).Err()
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.ForEachNode(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.Do(ctx, "ACL", "DELUSER", user).Err()
		})
	})
	return redistest.ConnectAs(t, user, "secret")
}

// TestLeastPrivilegeACL: a user whose keys and channels are limited to
// "<KeyPrefix>:*" runs the whole API (every key and channel of a Guard starts
// with the prefix); a user limited to another prefix gets ErrUnavailable,
// never a wrong answer.
func TestLeastPrivilegeACL(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	prefix := c.Prefix
	rdb := aclUser(t, c, "cg-"+prefix, prefix)
	logs := newLogWatch()
	opts := &guard.Options{KeyPrefix: prefix, Local: &guard.LocalOptions{}, Filter: guard.FilterOptions{ExpectedItems: 10_000},
		Logger: slog.New(logs)}
	g, err := guard.New(ctx, rdb, "product", opts)
	if err != nil {
		t.Fatalf("New as a user limited to %s:*: %v", prefix, err)
	}
	defer g.Close()
	d := newDB(10)
	// Keys outside the prefix that other tests left on the server (tests do
	// not delete their keys, and with -count N this test runs after all of
	// them): only the ones that appear while this test runs count.
	outside := func() map[string]bool {
		t.Helper()
		keys, err := c.AllKeys(ctx, "*")
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[string]bool)
		for _, k := range keys {
			if strings.Contains(k, ":product:") && !strings.HasPrefix(k, prefix+":") {
				out[k] = true
			}
		}
		return out
	}
	before := outside()
	steps := []struct {
		name string
		run  func() error
	}{
		{"Rebuild", func() error { _, err := g.Rebuild(ctx, ids("p", 10), nil); return err }},
		{"Get miss", func() error { _, err := guard.Get(ctx, g, "p1", d.load); return err }},
		{"Get hit", func() error { _, err := guard.Get(ctx, g, "p1", d.load); return err }},
		{"Peek", func() error { _, _, err := g.Peek(ctx, "p2"); return err }},
		{"MayExist", func() error { _, err := g.MayExist(ctx, "p3"); return err }},
		{"Add", func() error { return g.Add(ctx, "p10") }},
		{"Get marker", func() error {
			if _, err := guard.Get(ctx, g, "p10", d.load); !errors.Is(err, guard.ErrNotFound) {
				return err
			}
			return nil
		}},
		{"Invalidate", func() error { return g.Invalidate(ctx, "p1", "p10") }},
		{"Info", func() error { _, err := g.Info(ctx); return err }},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s as a least-privilege user: %v", s.name, err)
		}
	}
	if st := g.Stats(); st.RedisErrors != 0 {
		t.Fatalf("redis errors as a least-privilege user: %+v", st)
	}
	// No INFO (a @dangerous command): the eviction policy is unknown, said
	// once at INFO; noticing lost writes needs none (its marks were read:
	// the first read after a write checks them). With README's client, the
	// whole run writes no WARN.
	logs.mu.Lock()
	all := strings.Join(logs.msgs, "\n")
	logs.mu.Unlock()
	if strings.Count(all, "INFO cacheguard: cannot read redis's eviction policy") != 1 || strings.Contains(all, "refuses a command") {
		t.Fatalf("logs as a user without INFO:\n%s", all)
	}
	if n := strings.Count(all, "WARN "); n != 0 {
		t.Fatalf("%d WARN lines as the least-privilege user of docs/operations.md:\n%s", n, all)
	}
	t.Logf("least-privilege Guard: %d WARN lines", strings.Count(all, "WARN "))
	for k := range outside() {
		if !before[k] {
			t.Errorf("key %q does not start with the KeyPrefix %q", k, prefix)
		}
	}

	other := aclUser(t, c, "cg-other-"+prefix, "elsewhere")
	_, err = guard.New(ctx, other, "product", opts)
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("New as a user limited to another prefix: %v, want ErrUnavailable", err)
	}
}

// TestCloseIsOneGate: after Close every entry point answers ErrClosed, the
// in-process cache included (its invalidation subscription is gone).
func TestCloseIsOneGate(t *testing.T) {
	ctx := context.Background()
	_, g, d := setup(t, 10, &guard.Options{Local: &guard.LocalOptions{TTL: time.Minute}})
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	ops := []struct {
		name string
		run  func() error
	}{
		{"Get (held in memory)", func() error { _, err := guard.Get(ctx, g, "p1", d.load); return err }},
		{"Get", func() error { _, err := guard.Get(ctx, g, "p2", d.load); return err }},
		{"Peek", func() error { _, _, err := g.Peek(ctx, "p1"); return err }},
		{"MayExist", func() error { _, err := g.MayExist(ctx, "p1"); return err }},
		{"Add", func() error { return g.Add(ctx, "p11") }},
		{"Invalidate", func() error { return g.Invalidate(ctx, "p1") }},
		{"Rebuild", func() error { _, err := g.Rebuild(ctx, ids("p", 10), nil); return err }},
		{"Info", func() error { _, err := g.Info(ctx); return err }},
	}
	for _, op := range ops {
		if err := op.run(); !errors.Is(err, guard.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", op.name, err)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestSentinelsNameThePackage: every guard sentinel prints "cacheguard: ".
func TestSentinelsNameThePackage(t *testing.T) {
	for _, err := range []error{guard.ErrNotFound, guard.ErrInvalidKey, guard.ErrLoaderPanic, guard.ErrInvalidOptions,
		guard.ErrBusy, guard.ErrClosed, guard.ErrUnavailable} {
		if !strings.HasPrefix(err.Error(), "cacheguard: ") {
			t.Errorf("sentinel %q does not start with \"cacheguard: \"", err)
		}
	}
}
