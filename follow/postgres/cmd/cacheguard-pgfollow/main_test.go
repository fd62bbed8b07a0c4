package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// TestCommand: the command creates the publication and the slot, follows
// them, and an UPDATE made straight in the database reaches a Guard in
// another process; its metrics show the lag; SIGTERM (ctx) ends it with 0,
// and -drop-slot drops the slot.
func TestCommand(t *testing.T) {
	ctx := context.Background()
	srv, pool, c, reader, load := newProducts(t, "wal_level=logical")
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Server(t)
	args := []string{"-pg", srv.URL("postgres"), "-redis", followerURL(rs, c), "-prefix", c.Prefix,
		"-table", "products=product", "-create", "-metrics", fmt.Sprintf("127.0.0.1:%d", port)}
	cmdCtx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(cmdCtx, args, func(string) string { return "" }, &stderr) }()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("exit %d\n%s", code, stderr.String())
		}
		// Default flags, README's client: no WARN from start to SIGTERM,
		// which is logged.
		if n := strings.Count(stderr.String(), "level=WARN"); n != 0 || !strings.Contains(stderr.String(), "stopped;") {
			t.Errorf("%d WARN lines, or no line for the stop:\n%s", n, stderr.String())
		}
		t.Logf("a default run of cacheguard-pgfollow: %d WARN lines", strings.Count(stderr.String(), "level=WARN"))
		// -drop-slot: the server stops keeping WAL for it.
		if code := run(ctx, []string{"-pg", srv.URL("postgres"), "-drop-slot"}, func(string) string { return "" }, &stderr); code != 0 {
			t.Errorf("-drop-slot: exit %d\n%s", code, stderr.String())
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&n); err != nil || n != 0 {
			t.Errorf("after -drop-slot: %d slots, %v", n, err)
		}
	}()
	waitFor(t, "the slot to be consumed", func() bool {
		var active bool
		return pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'cacheguard'").Scan(&active) == nil && active
	})
	positioned(t, c)
	if v, err := guard.Get(ctx, reader, "p1", load); err != nil || v != 1 {
		t.Fatalf("Get p1 = %d, %v", v, err)
	}
	if _, err := pool.Exec(ctx, "UPDATE products SET v = 2 WHERE id = 'p1'"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the UPDATE to reach the reader", func() bool {
		v, err := guard.Get(ctx, reader, "p1", load)
		return err == nil && v == 2
	})
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The first start finds no position in Redis: a rollback.
	for _, m := range []string{"cacheguard_pgfollow_lag_bytes", "cacheguard_pgfollow_changes_total 1", "cacheguard_pgfollow_rollbacks_total 1"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("metrics lack %q:\n%s", m, body)
		}
	}
	docsNameTheMetrics(t, string(body))
	// A DELETE and an INSERT, under the follower's user: the Delete's
	// script reads the entry's fields (HKEYS), which the user of
	// docs/usage.md lacked until chaos seed 1 found every DELETE refused
	// and the follower stuck retrying it.
	if _, err := pool.Exec(ctx, "DELETE FROM products WHERE id = 'p1'; INSERT INTO products VALUES ('p2', 3)"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the DELETE and the INSERT to reach the reader", func() bool {
		_, err := guard.Get(ctx, reader, "p1", load)
		v, err2 := guard.Get(ctx, reader, "p2", load)
		return errors.Is(err, guard.ErrNotFound) && err2 == nil && v == 3
	})
}

// newProducts starts a PostgreSQL server with settings and a table
// products (p1, v 1), and opens a reader: the Guard "product" on a Redis
// client of its own, and its load function.
func newProducts(t *testing.T, settings ...string) (*pgserver.Server, *pgxpool.Pool, *redistest.Conn, *guard.Guard,
	func(context.Context, string) (int, error)) {
	t.Helper()
	ctx := context.Background()
	srv, err := pgserver.Start(settings...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	pool, err := pgxpool.New(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, sql := range []string{"CREATE TABLE products (id text PRIMARY KEY, v int)", "INSERT INTO products VALUES ('p1', 1)"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	c := redistest.Connect(t)
	// The reader and the follower run as the users of docs/usage.md;
	// whatever either is refused fails the test when it ends.
	svc := "svc-" + c.Prefix
	rdb := c.ACLUser(t, svc, c.Prefix, keyspace.ACLService)
	c.ACLUser(t, "pgf-"+c.Prefix, c.Prefix, keyspace.ACLFollower)
	t.Cleanup(func() {
		if refused := c.Refused(t, svc); len(refused) != 0 {
			t.Errorf("ACL LOG of the reader (keyspace.ACLService): %v", refused)
		}
		if refused := c.Refused(t, "pgf-"+c.Prefix); len(refused) != 0 {
			t.Errorf("ACL LOG of the follower (keyspace.ACLFollower): %v", refused)
		}
	})
	reader, err := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: c.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close() })
	load := func(ctx context.Context, id string) (int, error) {
		var v int
		err := pool.QueryRow(ctx, "SELECT v FROM products WHERE id = $1", id).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, guard.ErrNotFound
		}
		return v, err
	}
	return srv, pool, c, reader, load
}

// TestRedisOptions: the client is README's unless the URL says otherwise,
// and the URL may say what redis.ParseURL alone refuses.
func TestRedisOptions(t *testing.T) {
	for _, c := range []struct {
		url            string
		ctx            bool
		dials, retries int
	}{
		{"redis://localhost:6379", true, 1, -1},
		{"redis://localhost:6379?context_timeout_enabled=true&dialer_retries=1", true, 1, -1},
		{"redis://u:p%40ss@localhost:6379/2?context_timeout_enabled=false&dialer_retries=3&max_retries=2&dial_timeout=2s", false, 3, 2},
		{"unix:///tmp/redis.sock?db=1", true, 1, -1},
	} {
		o, err := redisOptions(c.url)
		if err != nil || o.ContextTimeoutEnabled != c.ctx || o.DialerRetries != c.dials || o.MaxRetries != c.retries {
			t.Errorf("%s: %+v, %v", c.url, o, err)
		}
	}
	if o, err := redisOptions("redis://u:p%40ss@h:1/2?dial_timeout=2s"); err != nil || o.Password != "p@ss" || o.DB != 2 || o.DialTimeout != 2*time.Second {
		t.Errorf("go-redis's own parameters: %+v, %v", o, err)
	}
	for _, bad := range []string{"redis://h?dialer_retries=x", "redis://h?context_timeout_enabled=maybe", "redis://h?nonsense=1"} {
		if _, err := redisOptions(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestUsage: -h says what PostgreSQL needs, and one default for each flag
// set from the environment, without printing the URLs there.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	env := map[string]string{"DATABASE_URL": "postgres://u:pgsecret@db/x", "REDIS_URL": "redis://:redissecret@r:6379"}
	if code := run(context.Background(), []string{"-h"}, func(k string) string { return env[k] }, &out); code != 2 {
		t.Fatalf("exit %d", code)
	}
	for _, s := range []string{"wal_level = logical", "REPLICATION", "REPLICA IDENTITY", "-drop-slot", "max_slot_wal_keep_size", "-recover",
		"-inspect-rate", "-inspect-delays durations", "-inspect-repair", "-summary"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("usage lacks %q", s)
		}
	}
	for _, flag := range []string{"-pg", "-redis"} {
		_, help, _ := strings.Cut(out.String(), "\n  "+flag+" ")
		help, _, _ = strings.Cut(help, "\n  -")
		if n := strings.Count(help, "default"); n != 1 || strings.Contains(help, "secret") {
			t.Errorf("%s's help names %d defaults, or a URL from the environment: %q", flag, n, help)
		}
	}
}

// TestBadFlags: a flag value out of range, or not a duration, exits 2
// saying which; nothing is connected to before (the PostgreSQL URL leads
// nowhere), and -slot is checked before -create sets anything up.
func TestBadFlags(t *testing.T) {
	rs := redistest.Server(t)
	c := redistest.Connect(t)
	base := []string{"-pg", "postgres://postgres@127.0.0.1:1/none", "-redis", "unix://" + rs.Addr, "-prefix", c.Prefix,
		"-table", "products=product"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-inspect-rate", "1.5"}, "-inspect-rate 1.5: want at most 1"},
		{[]string{"-inspect-rate", "NaN"}, "-inspect-rate NaN: want at most 1"},
		{[]string{"-inspect-delays", "1s,0s"}, `-inspect-delays "1s,0s": 0s: want each above 0`},
		{[]string{"-inspect-delays", "-1s"}, `-inspect-delays "-1s": -1s: want each above 0`},
		{[]string{"-inspect-delays", "1s,soon"}, `-inspect-delays "1s,soon": time: invalid duration "soon"`},
		{[]string{"-inspect-delays", ""}, `-inspect-delays "": time: invalid duration ""`},
		{[]string{"-summary", "-1s"}, "-summary -1s: want 0 (never) or more"},
		{[]string{"-summary", "often"}, `invalid value "often" for flag -summary`},
		{[]string{"-slot", "Bad-Slot", "-create"}, `pgfollow: invalid options: slot "Bad-Slot"`},
	} {
		var out bytes.Buffer
		code := run(context.Background(), append(base, tc.args...), func(string) string { return "" }, &out)
		if code != 2 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%q: exit %d, want 2 saying %q:\n%s", tc.args, code, tc.want, out.String())
		}
	}
}

// TestInspector: with every ID inspected 200 ms and 400 ms after its
// write, the command's -summary logs a line per delay with the checks of
// 100 changes (100 checks, none inconsistent: at least 2 nines), as
// -metrics serves them by table and delay.
func TestInspector(t *testing.T) {
	ctx := context.Background()
	srv, pool, c, _, _ := newProducts(t, "wal_level=logical")
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Server(t)
	args := []string{"-pg", srv.URL("postgres"), "-redis", "unix://" + rs.Addr, "-prefix", c.Prefix,
		"-table", "products=product", "-create", "-metrics", fmt.Sprintf("127.0.0.1:%d", port),
		"-inspect-rate", "1", "-inspect-delays", "200ms,400ms", "-summary", "200ms"}
	cmdCtx, stop := context.WithCancel(ctx)
	stderr, lines := logPipe()
	var seen []string
	done := make(chan int, 1)
	go func() {
		done <- run(cmdCtx, args, func(string) string { return "" }, stderr)
		stderr.Close()
	}()
	defer func() {
		stop()
		for l := range lines {
			seen = append(seen, l)
		}
		if code := <-done; code != 0 {
			t.Errorf("exit %d\n%s", code, strings.Join(seen, "\n"))
		}
	}()
	// waitLine reads the log up to a line holding each of parts.
	waitLine := func(parts ...string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the log ended without a line holding %q:\n%s", parts, strings.Join(seen, "\n"))
				}
				seen = append(seen, l)
				if all(l, parts) {
					return
				}
			case <-timeout:
				t.Fatalf("no line holding %q within 30 s:\n%s", parts, strings.Join(seen, "\n"))
			}
		}
	}
	// Before any check: counts, no figure.
	for _, d := range []string{"200ms", "400ms"} {
		waitLine("level=INFO", `msg="cacheguard-pgfollow: inspector" delay=`+d+
			` checked=0 inconsistent=0 repaired=0 window_checked=0 window_inconsistent=0 lag_bytes=`)
	}
	positioned(t, c)
	for _, sql := range []string{"INSERT INTO products SELECT 'n' || i, i FROM generate_series(1, 99) i", "UPDATE products SET v = 2 WHERE id = 'p1'"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// None found in 100 checks at each delay: at least 2 nines, no more said.
	for _, d := range []string{"200ms", "400ms"} {
		waitLine(`msg="cacheguard-pgfollow: inspector" delay=`+d+` checked=100 inconsistent=0 repaired=0 window_checked=`, "nines_at_least=2 lag_bytes=")
	}

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{
		`cacheguard_pgfollow_inspected_total{delay="200ms",table="public.products"} 100`,
		`cacheguard_pgfollow_inconsistent_total{delay="200ms",table="public.products"} 0`,
		`cacheguard_pgfollow_inspect_repaired_total{delay="200ms",table="public.products"} 0`,
		`cacheguard_pgfollow_inspected_total{delay="400ms",table="public.products"} 100`,
		"cacheguard_pgfollow_changes_total 100",
		"cacheguard_pgfollow_rollbacks_total 1",
	} {
		if !strings.Contains(string(body), m+"\n") {
			t.Errorf("metrics lack %q:\n%s", m, body)
		}
	}
	if strings.Contains(string(body), "cacheguard_pgfollow_consistency_nines{") { // none found: no figure
		t.Errorf("metrics give nines with no inconsistency found:\n%s", body)
	}
}

// logPipe is a log sink for run whose lines a test reads as they come,
// from the channel, which is closed once w is.
func logPipe() (w *io.PipeWriter, lines <-chan string) {
	r, w := io.Pipe()
	ch := make(chan string, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return w, ch
}

func all(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestRecover: changes made while the command is stopped, past the WAL
// that max_slot_wal_keep_size lets the slot keep: PostgreSQL invalidates
// the slot. The command then exits 1 saying how to recover; with -recover
// it makes the slot anew, drops the Guard's entries and rebuilds its filter
// (the row updated meanwhile answers its new value, the one inserted is
// found), and follows.
func TestRecover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server of its own")
	}
	ctx := context.Background()
	srv, pool, c, reader, load := newProducts(t, "wal_level=logical", "max_slot_wal_keep_size=1MB")
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := reader.Rebuild(ctx, func(yield func(string, error) bool) { yield("p1", nil) }, nil); err != nil {
		t.Fatal(err)
	}
	rs := redistest.Server(t)
	args := []string{"-pg", srv.URL("postgres"), "-redis", followerURL(rs, c), "-prefix", c.Prefix, "-table", "products=product"}
	noEnv := func(string) string { return "" }
	var stderr bytes.Buffer
	cmdCtx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() { done <- run(cmdCtx, append(args, "-create"), noEnv, &stderr) }()
	active := func() bool { // streaming: a slot being created is active too
		var n int
		return pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state IN ('catchup', 'streaming')").Scan(&n) == nil && n == 1
	}
	waitFor(t, "the slot to be consumed", active)
	positioned(t, c)
	if v, err := guard.Get(ctx, reader, "p1", load); err != nil || v != 1 {
		t.Fatalf("Get p1 = %d, %v", v, err)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}

	exec("UPDATE products SET v = 2 WHERE id = 'p1'")
	exec("INSERT INTO products VALUES ('p2', 3)")
	waitFor(t, "the slot to be lost", func() bool {
		exec("SELECT pg_switch_wal()")
		exec("CHECKPOINT")
		var status string
		return pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cacheguard'").Scan(&status) == nil &&
			status == "lost"
	})
	stderr.Reset()
	if code := run(ctx, args, noEnv, &stderr); code != 1 || !strings.Contains(stderr.String(), "-recover") {
		t.Fatalf("on a lost slot without -recover: exit %d, want 1 saying -recover\n%s", code, stderr.String())
	}
	if v, err := guard.Get(ctx, reader, "p1", load); err != nil || v != 1 {
		t.Fatalf("Get p1 = %d, %v; want the stale 1 (the control: the update was lost with the slot)", v, err)
	}

	cmdCtx, stop = context.WithCancel(ctx)
	go func() { done <- run(cmdCtx, append(args, "-recover"), noEnv, &stderr) }()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("-recover: exit %d\n%s", code, stderr.String())
		}
	}()
	waitFor(t, "the slot to be consumed again", active)
	for id, want := range map[string]int{"p1": 2, "p2": 3} {
		if v, err := guard.Get(ctx, reader, id, load); err != nil || v != want {
			t.Fatalf("after -recover, Get %s = %d, %v; want %d", id, v, err, want)
		}
	}
	exec("UPDATE products SET v = 4 WHERE id = 'p2'")
	waitFor(t, "an UPDATE after the recovery to reach the reader", func() bool {
		v, err := guard.Get(ctx, reader, "p2", load)
		return err == nil && v == 4
	})
}

// followerURL is the Redis URL of the follower's user (newProducts).
func followerURL(rs *redisserver.Server, c *redistest.Conn) string {
	return "unix://pgf-" + c.Prefix + ":secret@" + rs.Addr
}

// positioned waits until the command's follower has set its position in
// Redis: its first start drops the Guard's entries, so cache after it.
func positioned(t *testing.T, c *redistest.Conn) {
	t.Helper()
	waitFor(t, "the follower's position in redis", func() bool {
		return c.Exists(context.Background(), c.Prefix+":product:pos:pgfollow:cacheguard").Val() == 1
	})
}

// waitFor polls cond (every 10 ms, up to 30 s): the state the test needs,
// held by processes it does not own.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling state the test does not own
	}
}

// TestCommandOnACluster: with -cluster, -redis is a cluster URL, and an
// UPDATE, a DELETE and an INSERT made in the database reach a Guard in
// another process on the cluster (the chaos run's cluster variant runs the
// command so).
func TestCommandOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster: make test")
	}
	ctx := context.Background()
	srv, err := pgserver.Start("wal_level=logical")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	pool, err := pgxpool.New(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE products (id text PRIMARY KEY, v int); INSERT INTO products VALUES ('p1', 1)"); err != nil {
		t.Fatal(err)
	}
	cl, err := redisserver.StartCluster(ctx, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	addrs := cl.Addrs()
	rawURL := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	rdb := redis.NewClusterClient(cl.Options())
	defer rdb.Close()
	reader, err := guard.New(ctx, rdb, "product", &guard.Options{KeyPrefix: "pc"})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	load := func(ctx context.Context, id string) (int, error) {
		var v int
		err := pool.QueryRow(ctx, "SELECT v FROM products WHERE id = $1", id).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, guard.ErrNotFound
		}
		return v, err
	}
	cmdCtx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(cmdCtx, []string{"-pg", srv.URL("postgres"), "-redis", rawURL, "-cluster", "-prefix", "pc",
			"-table", "products=product", "-create"}, func(string) string { return "" }, &stderr)
	}()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("exit %d\n%s", code, stderr.String())
		}
	}()
	waitFor(t, "the slot to be consumed", func() bool {
		var active bool
		return pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'cacheguard'").Scan(&active) == nil && active
	})
	if v, err := guard.Get(ctx, reader, "p1", load); err != nil || v != 1 {
		t.Fatalf("Get p1 = %d, %v", v, err)
	}
	if _, err := pool.Exec(ctx, "UPDATE products SET v = 2 WHERE id = 'p1'; INSERT INTO products VALUES ('p2', 3)"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the UPDATE and the INSERT to reach the reader", func() bool {
		v, err := guard.Get(ctx, reader, "p1", load)
		v2, err2 := guard.Get(ctx, reader, "p2", load)
		return err == nil && v == 2 && err2 == nil && v2 == 3
	})
	if _, err := pool.Exec(ctx, "DELETE FROM products WHERE id = 'p1'"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the DELETE to reach the reader", func() bool {
		_, err := guard.Get(ctx, reader, "p1", load)
		return errors.Is(err, guard.ErrNotFound)
	})
}
