package guard_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
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

// TestLeastPrivilegeACL: a user whose keys and channels are limited to
// "<KeyPrefix>:*" runs the whole API (every key and channel of a Guard starts
// with the prefix); a user limited to another prefix gets ErrUnavailable,
// never a wrong answer.
func TestLeastPrivilegeACL(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	prefix := c.Prefix
	user := "cg-" + prefix
	rdb := c.ACLUser(t, user, prefix, keyspace.ACLService)
	logs := newLogWatch()
	var ranged atomic.Int32
	source := func(context.Context) iter.Seq2[string, error] { ranged.Add(1); return ids("p", 10) }
	opts := &guard.Options{KeyPrefix: prefix, Local: &guard.LocalOptions{},
		Filter: guard.FilterOptions{ExpectedItems: 10_000, IDs: source}, Logger: slog.New(logs)}
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
	var healthy string // the log until the incident
	steps := []struct {
		name string
		run  func() error
	}{
		{"Rebuild", func() error { _, err := g.Rebuild(ctx, ids("p", 10), nil); return err }},
		{"Get miss", func() error { _, err := guard.Get(ctx, g, "p1", d.load); return err }},
		{"Get hit", func() error { _, err := guard.Get(ctx, g, "p1", d.load); return err }},
		{"Peek", func() error { _, _, err := g.Peek(ctx, "p2"); return err }},
		{"GetMany", func() error { // on a Cluster its reads span masters
			_, err := guard.GetMany(ctx, g, []string{"p1", "p4", "p5", "p6", "nope"}, (&batchDB{db: d}).loadMany)
			return err
		}},
		{"MayExist", func() error { _, err := g.MayExist(ctx, "p3"); return err }},
		{"Add", func() error { return g.Add(ctx, "p10") }},
		{"Get marker", func() error {
			if _, err := guard.Get(ctx, g, "p10", d.load); !errors.Is(err, guard.ErrNotFound) {
				return err
			}
			return nil
		}},
		{"Invalidate", func() error { return g.Invalidate(ctx, "p1", "p10") }},
		{"Set", func() error { return guard.Set(ctx, g, "p3", product{ID: "p3", Price: 33}) }},
		{"Delete", func() error { return g.Delete(ctx, "p3") }}, // every version's entry becomes the marker (HKEYS)
		{"Info", func() error { _, err := g.Info(ctx); return err }},
		{"the automatic rebuild after Redis lost everything", func() error {
			before := ranged.Load()
			logs.mu.Lock()
			healthy = strings.Join(logs.msgs, "\n")
			logs.mu.Unlock()
			if err := c.DropOwn(ctx); err != nil {
				return err
			}
			// A Get finds the filter gone and starts the rebuild.
			if _, err := guard.Get(ctx, g, "p2", d.load); err != nil {
				return err
			}
			if !redistest.Poll(20*time.Second, func() bool {
				in, err := g.Info(ctx)
				return err == nil && in.Ready && ranged.Load() > before
			}) {
				return fmt.Errorf("no rebuild within 20 s: Filter.IDs ranged %d times", ranged.Load()-before)
			}
			return nil
		}},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s as a least-privilege user: %v", s.name, err)
		}
	}
	if !testing.Short() { // the local copy's subscription pings Redis when idle for 3 s
		eventually(t, 10*time.Second, "the subscription's health check (PING)", func() bool {
			var pinged atomic.Bool
			_ = c.ForEachNode(ctx, func(ctx context.Context, n *redis.Client) error {
				list, err := n.ClientList(ctx).Result()
				pinged.CompareAndSwap(false, strings.Contains(list, "cmd=ping user="+user))
				return err
			})
			return pinged.Load()
		})
	}
	if refused := c.Refused(t, user); len(refused) != 0 {
		t.Fatalf("ACL LOG of the least-privilege user of docs/usage.md: %v", refused)
	}
	if st := g.Stats(); st.RedisErrors != 0 {
		t.Fatalf("redis errors as a least-privilege user: %+v", st)
	}
	// With README's client, the whole run, the rebuild included, writes no
	// WARN, and nothing is refused.
	logs.mu.Lock()
	all := strings.Join(logs.msgs, "\n")
	logs.mu.Unlock()
	if strings.Contains(all, "cannot read redis's eviction policy") || strings.Contains(all, "refuses a command") {
		t.Fatalf("logs as the least-privilege user:\n%s", all)
	}
	if n := strings.Count(healthy, "WARN "); n != 0 || strings.Contains(all, "ERROR ") {
		t.Fatalf("%d WARN lines before the incident, as the least-privilege user of docs/usage.md:\n%s", n, all)
	}
	t.Logf("least-privilege Guard: %d WARN lines, all in the incident", strings.Count(all, "WARN "))
	for k := range outside() {
		if !before[k] {
			t.Errorf("key %q does not start with the KeyPrefix %q", k, prefix)
		}
	}

	// Without INFO (the one @dangerous command of the user) the eviction
	// policy is unknown: said once, at INFO.
	noInfo := newLogWatch()
	gi, err := guard.New(ctx, c.ACLUser(t, "cg-noinfo-"+prefix, prefix, strings.ReplaceAll(keyspace.ACLService, "+info", "")),
		"product", &guard.Options{KeyPrefix: prefix, Logger: slog.New(noInfo)})
	if err != nil {
		t.Fatal(err)
	}
	_ = gi.Close()
	noInfo.mu.Lock()
	infoLines := strings.Join(noInfo.msgs, "\n")
	noInfo.mu.Unlock()
	if n := strings.Count(infoLines, "INFO cacheguard: cannot read redis's eviction policy"); n != 1 {
		t.Fatalf("a user without +info: %d lines say the eviction policy is unknown, want 1:\n%s", n, infoLines)
	}

	other := c.ACLUser(t, "cg-other-"+prefix, "elsewhere", keyspace.ACLService)
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

// TestRefusedCommandIsNamed: a user without a command the automatic
// rebuild runs (HMGET, inside auto_rebuild.lua, where Redis names only the
// script's line) gets one ERROR that names it, and no rebuild; the user of
// docs/usage.md (TestLeastPrivilegeACL) rebuilds.
func TestRefusedCommandIsNamed(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c := redistest.Connect(t)
	logs := newLogWatch()
	rdb := c.ACLUser(t, "cg-nohmget-"+c.Prefix, c.Prefix, strings.ReplaceAll(keyspace.ACLService, "+hmget", ""))
	g, err := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: c.Prefix, Logger: slog.New(logs),
		Filter: guard.FilterOptions{ExpectedItems: 1000, IDs: func(context.Context) iter.Seq2[string, error] { return ids("p", 10) }}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := guard.Get(ctx, g, "p1", newDB(10).load); err != nil { // the filter was never built: the rebuild starts
		t.Fatal(err)
	}
	logs.wait(t, "ERROR cacheguard: redis refuses a command the Guard needs (ACL): the automatic rebuild")
	logs.mu.Lock()
	all := strings.Join(logs.msgs, "\n")
	logs.mu.Unlock()
	if !strings.Contains(all, "command=hmget") || strings.Count(all, "refuses a command") != 1 {
		t.Fatalf("the refusal must be said once, naming hmget:\n%s", all)
	}
}

// TestFullRedisIsNoACLRefusal: a Redis out of memory (maxmemory with
// noeviction) refuses the writes' marks with OOM: that is an outage, not an
// ACL that refuses a command. The chaos run (seed 2, an eviction burst) saw
// it logged at ERROR as an ACL refusal of "noticing writes Redis lost".
func TestFullRedisIsNoACLRefusal(t *testing.T) {
	ctx := context.Background()
	_, rdb := redistest.Private(t)
	logs := newLogWatch()
	g, err := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: "oom", Logger: slog.New(logs),
		Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, ids("p", 10), nil); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.ConfigSet(ctx, "maxmemory", "0")
	if err := guard.Set(ctx, g, "p1", product{ID: "p1"}); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Set with Redis full: %v, want ErrUnavailable", err)
	}
	logs.wait(t, "OOM")
	logs.mu.Lock()
	all := strings.Join(logs.msgs, "\n")
	logs.mu.Unlock()
	if strings.Contains(all, "ACL") {
		t.Fatalf("a full Redis logged as an ACL refusal:\n%s", all)
	}
}
