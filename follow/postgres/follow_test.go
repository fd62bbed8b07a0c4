package pgfollow_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	neturl "net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// newOn is newFixture on the package's PostgreSQL and Redis servers: the
// follower and the reader each on a client of their own.
func newOn(t *testing.T, rows int) *fixture {
	t.Helper()
	c := redistest.Connect(t)
	return newFixture(t, os.Getenv(envPG), c, redistest.Connect(t), c.Prefix, rows)
}

// TestMapping: each kind of row change, written straight into the table
// (outside any service), reaches a Guard in another process: INSERT → Add
// (the filter, built before, would reject the new ID; a marker of a deleted
// ID is cleared), UPDATE → Invalidate, DELETE → Invalidate (answered "not
// found" by one load, then its marker), a changed key → Invalidate of the old and Add of the
// new, TRUNCATE → every entry dropped and the filter rebuilt from Table.IDs
// (its line counts each: the entries dropped, the IDs in the new filter). A
// key the Guard refuses is logged with it and left out.
func TestMapping(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 10)
	var l logs
	fx.log = slog.New(&l)
	f, _ := fx.follow(fx.guard(fx.rdb))
	// A reader opened after the follower's first start (which rebuilds the
	// filter): its first reload of the filter's generation is the TRUNCATE's,
	// not throttled by one a moment before (a throttled one fails open: a load).
	fx.reader = fx.guard(redistest.Connect(t))
	fx.warm(10)
	step := func(what, sql string) {
		t.Helper()
		fx.exec(strings.ReplaceAll(sql, "{t}", fx.name))
		fx.caughtUp(f)
		t.Log(what)
	}
	want := func(id string, v int) {
		t.Helper()
		if got, err := fx.get(id); err != nil || got != v {
			t.Fatalf("Get %s = %d, %v; want %d", id, got, err, v)
		}
	}
	gone := func(id string) {
		t.Helper()
		n, _ := fx.loads.Load(id)
		before := int64(0)
		if n != nil {
			before = *n.(*int64)
		}
		// A deleted row is invalidated: the first Get reads its absence
		// (one load at most) and caches the marker, which answers the next.
		for range 2 {
			if _, err := fx.get(id); !errors.Is(err, guard.ErrNotFound) {
				t.Fatalf("Get %s: %v, want ErrNotFound", id, err)
			}
		}
		if n, _ := fx.loads.Load(id); n != nil && *n.(*int64) > before+1 {
			t.Fatalf("Get %s loaded %d times: want at most once, then the marker", id, *n.(*int64)-before)
		}
	}
	if _, err := fx.get("id10"); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get id10 before its INSERT: %v", err)
	}
	step("INSERT", "INSERT INTO {t} VALUES ('id10', 10)")
	want("id10", 10)
	step("UPDATE", "UPDATE {t} SET v = 22 WHERE id = 'id2'")
	want("id2", 22)
	step("DELETE", "DELETE FROM {t} WHERE id = 'id3'")
	gone("id3")
	step("INSERT of a deleted ID", "INSERT INTO {t} VALUES ('id3', 33)")
	want("id3", 33)
	step("UPDATE of the key", "UPDATE {t} SET id = 'id4b', v = 44 WHERE id = 'id4'")
	gone("id4")
	want("id4b", 44)
	step("changes in one transaction", "BEGIN; UPDATE {t} SET v = 5 WHERE id = 'id5'; DELETE FROM {t} WHERE id = 'id5'; "+
		"INSERT INTO {t} VALUES ('id5', 55); COMMIT")
	want("id5", 55)
	step("INSERT of a key the Guard refuses", "INSERT INTO {t} VALUES (E'bad\\001id', 6)")
	if line := l.find("refuses as an ID"); !strings.Contains(line, " id=bad\x01id ") {
		t.Fatalf("the refused key's line %q; want it with id=%q", line, "bad\x01id")
	}
	keys, err := fx.rdb.Keys(context.Background(), fx.prefix+":item:{*").Result()
	if err != nil {
		t.Fatal(err)
	}
	cached := map[string]bool{} // the IDs with an entry (or a lock) before the TRUNCATE
	for _, k := range keys {
		_, rest, _ := strings.Cut(k, "{")
		id, _, _ := strings.Cut(rest, "}")
		cached[id] = true
	}
	step("TRUNCATE", "TRUNCATE {t}")
	gone("id0")
	gone("id10")
	line, counts := l.find("TRUNCATE"), fmt.Sprintf(" entries_dropped=%d filter_ids=0", len(cached)) // the table is empty
	if len(cached) == 0 || !strings.Contains(line, counts) {
		t.Fatalf("the TRUNCATE's line %q; want %q (%d IDs were cached)", line, counts, len(cached))
	}
	t.Log(line)
	step("INSERT after TRUNCATE", "INSERT INTO {t} VALUES ('id0', 100)")
	want("id0", 100)
	if st := f.Stats(); st.Changes < 10 || st.LagSeconds != 0 || !st.Following {
		t.Fatalf("stats %+v", st)
	}
	// The server's end may be past the last applied commit (other tests'
	// WAL, on tables not published): its next keepalive brings it level.
	waitFor(t, "no lag in bytes", func() bool { return f.Stats().LagBytes == 0 })
}

// TestFollowerOff is the control of the scenarios: the same burst of
// UPDATEs with no follower leaves the reader serving old values, so the
// stale count of the others can fail.
func TestFollowerOff(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 100)
	fx.warm(100)
	fx.burst(0, 100, nil)
	if n := fx.stale(); n != 100 {
		t.Fatalf("%d stale rows without a follower, want 100 (every cached row)", n)
	}
}

// TestKilledMidBurst: a follower SIGKILLed in the middle of 10,000
// UPDATEs (one per row), as its third batch is about to be applied (received, neither
// applied nor confirmed), and another started after the rest of the
// burst: once it has caught up no row is stale (no change lost). Control:
// a follower that confirms each transaction as it receives it loses that
// batch, and this test fails.
func TestKilledMidBurst(t *testing.T) {
	t.Parallel()
	const rows = 10_000 // each updated once: a lost change is a stale row, never masked by a later one
	fx := newOn(t, rows)
	child := redistest.Spawn(t, "follow", "CG_TEST_TABLE="+fx.name, "CG_TEST_PREFIX="+fx.prefix, "CG_TEST_KILL_AT=3")
	fx.positioned()
	fx.warm(rows)
	dead := make(chan struct{})
	go func() {
		_ = child.Cmd.Wait() // killed: an error
		close(dead)
	}()
	fx.burst(0, rows, func(i int) {
		if i == 5000 {
			select {
			case <-dead:
			case <-time.After(30 * time.Second):
				t.Fatal("the child did not kill itself at its third batch")
			}
		}
	})
	if got := child.Cmd.ProcessState.String(); got != "signal: killed" {
		t.Fatalf("the child ended with %q, want SIGKILL", got)
	}
	// With no follower running: the rows of the batch it died in and of the
	// rest of the burst are stale (the scenario with the follower off).
	off := fx.stale()
	t.Logf("follower off: %d of %d rows stale", off, rows)
	if off < rows/2 {
		t.Fatalf("%d rows stale with no follower, want the 5,000 updated after its death at least", off)
	}
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.caughtUp(f)
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d of %d rows stale after the restart", n, rows)
	}
}

// TestRedisFrozen: Redis stopped (SIGSTOP) for 3 s in the middle of a
// burst: the follower holds its position (its lag grows) and retries, and
// once Redis answers again every change lands.
func TestRedisFrozen(t *testing.T) {
	t.Parallel()
	const rows = 3000
	srv, rdb := redistest.Private(t)
	readerRDB := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = readerRDB.Close() })
	fx := newFixture(t, os.Getenv(envPG), rdb, readerRDB, "frozen", rows)
	f, _ := fx.follow(fx.guard(rdb))
	fx.warm(rows)
	fx.burst(0, rows, func(i int) {
		if i != 1000 {
			return
		}
		if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) }()
		fx.exec("UPDATE " + fx.name + " SET v = v + 1 WHERE id = 'id0'")
		waitFor(t, "the follower to lag", func() bool { return f.Stats().LagBytes > 0 && f.Stats().Retries > 0 })
		time.Sleep(3 * time.Second) // the outage itself: Redis stays stopped this long
	})
	fx.caughtUp(f)
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d of %d rows stale after Redis came back", n, rows)
	}
	if st := f.Stats(); st.Retries == 0 {
		t.Fatalf("stats %+v: want retries", st)
	}
	// The server's LSN moves on with other tests' WAL: the lag returns to 0,
	// not at one instant (128 bytes of others' WAL failed the instant check).
	waitFor(t, "no lag once caught up", func() bool { return f.Stats().LagBytes == 0 })
}

// TestPostgresRestart: PostgreSQL restarted in the middle of a burst; the
// follower reconnects and resumes from its slot.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	const rows = 2000
	srv, fx := newPrivate(t, rows)
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.warm(rows)
	restarted := false
	for i := range rows {
		if i == 700 {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			restarted = true
		}
		// A connection the restart cut fails once; the pool makes a new one.
		_, _ = fx.pool.Exec(context.Background(), "UPDATE "+fx.name+" SET v = v + 1 WHERE id = $1", fmt.Sprintf("id%d", i))
	}
	if !restarted {
		t.Fatal("not restarted")
	}
	fx.caughtUp(f)
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d of %d rows stale after PostgreSQL's restart", n, rows)
	}
}

// newPrivate is newFixture on a PostgreSQL server of its own, started with
// settings, and the package's Redis.
func newPrivate(t *testing.T, rows int, settings ...string) (*pgserver.Server, *fixture) {
	t.Helper()
	srv, err := startLogical(settings...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	c := redistest.Connect(t)
	return srv, newFixture(t, srv.URL("postgres"), c, redistest.Connect(t), c.Prefix, rows)
}

// TestStandby: a second follower of the slot waits while the first
// consumes it, and takes over when the first stops.
func TestStandby(t *testing.T) {
	t.Parallel()
	const rows = 400
	fx := newOn(t, rows)
	first, stopFirst := fx.follow(fx.guard(fx.rdb))
	fx.warm(rows)
	waitFor(t, "the first to follow", func() bool { return first.Stats().Following })
	var l logs
	fx.log = slog.New(&l)
	second, _ := fx.follow(fx.guard(fx.rdb))
	waitFor(t, "the second to stand by", func() bool { return second.Stats().Standby })
	fx.burst(0, 200, nil)
	fx.caughtUp(first)
	stopFirst()
	fx.burst(200, 200, nil)
	waitFor(t, "the second to take over", func() bool { return second.Stats().Following })
	fx.caughtUp(second)
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d of %d rows stale after the standby took over", n, rows)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.ContainsFunc(l.recs, func(r slog.Record) bool { return strings.Contains(r.Message, "standby takes over") }) {
		t.Fatalf("the standby took over without a log line: %v", l.recs)
	}
}

// TestSetupErrors: a set-up that cannot work ends Run with ErrSetup and
// says what to run; the test runs that command, as an administrator would,
// and the next Run gets past it: it follows, or stops at the next problem.
func TestSetupErrors(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 1)
	url := os.Getenv(envPG)
	g := fx.guard(fx.rdb)
	n := fx.name
	fx.exec("CREATE TABLE " + n + "_nopk (id text, v int)")
	fx.exec("CREATE ROLE " + n + "_plain LOGIN")
	fx.exec("CREATE TABLE " + n + "_parts (id text PRIMARY KEY, v int) PARTITION BY HASH (id)")
	fx.exec("CREATE TABLE " + n + "_parts0 PARTITION OF " + n + "_parts FOR VALUES WITH (MODULUS 1, REMAINDER 0)")
	fx.exec("CREATE PUBLICATION " + n + "_bypart FOR TABLE " + n + "_parts") // the partitions' names, PostgreSQL's default
	fx.exec("CREATE PUBLICATION " + n + "_ins FOR TABLE " + n + " WITH (publish = 'insert')")
	fx.exec("SELECT pg_create_logical_replication_slot('" + n + "_td', 'test_decoding')")
	t.Cleanup(func() { _ = pgfollow.DropSlot(context.Background(), url, n+"_s") }) // made by the first case's command
	cases := []struct {
		name, url, table, key, slot, pub, want string
		keyAfter, then                         string // the next Run's key if another, and what it stops at ("": it follows)
	}{
		{name: "missing slot", url: url, table: n, slot: n + "_s", pub: n, want: "-create"},
		{name: "missing publication", url: url, table: n, slot: n, pub: n + "_p", want: "CREATE PUBLICATION"},
		{name: "a kind of change not published", url: url, table: n, slot: n, pub: n + "_ins", want: "publish ="},
		{name: "slot of another plugin", url: url, table: n, slot: n + "_td", pub: n, want: "not pgoutput", then: "no replication slot"},
		{name: "role without REPLICATION", url: strings.Replace(url, "postgres@", n+"_plain@", 1), table: n, slot: n, pub: n, want: "ALTER ROLE"},
		{name: "table not published", url: url, table: n + "_nopk", slot: n, pub: n, want: "ADD TABLE", then: "primary key"},
		{name: "key outside the replica identity", url: url, table: n + "_nopk", key: "v", slot: n, pub: n, want: "replica identity"},
		{name: "no primary key", url: url, table: n + "_nopk", slot: n, pub: n, want: "REPLICA IDENTITY", keyAfter: "id"},
		{name: "partitioned, published by partition", url: url, table: n + "_parts", slot: n, pub: n + "_bypart", want: "publish_via_partition_root"},
	}
	for _, c := range cases {
		f, err := pgfollow.New(c.url, []pgfollow.Table{{Name: c.table, Key: c.key, Guard: g}}, &pgfollow.Options{Slot: c.slot, Publication: c.pub})
		if err != nil {
			t.Fatal(err)
		}
		err = runUntilFollowing(f)
		if !errors.Is(err, pgfollow.ErrSetup) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrSetup saying %q", c.name, err, c.want)
			continue
		}
		if !fx.advice(err) {
			continue
		}
		if c.keyAfter != "" {
			c.key = c.keyAfter
		}
		f, _ = pgfollow.New(c.url, []pgfollow.Table{{Name: c.table, Key: c.key, Guard: g}}, &pgfollow.Options{Slot: c.slot, Publication: c.pub})
		switch next := runUntilFollowing(f); {
		case c.then == "" && next != nil:
			t.Errorf("%s: after its command, Run: %v; want it following", c.name, next)
		case c.then != "" && (next == nil || !strings.Contains(next.Error(), c.then)):
			t.Errorf("%s: after its command, Run: %v; want an error saying %q", c.name, next, c.then)
		}
	}
	plain, err := pgserver.Start() // wal_level replica, the default
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Remove()
	f, _ := pgfollow.New(plain.URL("postgres"), []pgfollow.Table{{Name: "t", Guard: g}}, nil)
	err = f.Run(context.Background())
	if !errors.Is(err, pgfollow.ErrSetup) || !strings.Contains(err.Error(), "wal_level = logical") {
		t.Fatalf("wal_level replica: %v, want ErrSetup saying wal_level = logical", err)
	}
	if !(&fixture{t: t, pool: poolOf(t, plain.URL("postgres"))}).advice(err) {
		return
	}
	if err := plain.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := f.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "no replication slot") {
		t.Errorf("wal_level set as told and PostgreSQL restarted: %v; want the next problem, no slot", err)
	}
}

// adviceSQL finds the command an ErrSetup says to run.
var adviceSQL = regexp.MustCompile(`(ALTER|CREATE|SELECT) [^;]*`)

// advice runs the command that err says to run, and reports whether
// PostgreSQL accepted it.
func (fx *fixture) advice(err error) bool {
	fx.t.Helper()
	sql := adviceSQL.FindString(err.Error())
	if sql == "" {
		fx.t.Errorf("no command in %v", err)
		return false
	}
	if _, err := fx.pool.Exec(context.Background(), sql); err != nil {
		fx.t.Errorf("the advice %q: %v", sql, err)
		return false
	}
	return true
}

// poolOf is a pool of connections to url, closed when the test ends.
func poolOf(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runUntilFollowing runs f until it consumes its slot (nil) or Run ends
// (its error).
func runUntilFollowing(f *pgfollow.Follower) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, should it hang
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Millisecond): // polling the follower's state
		}
		if f.Stats().Following {
			cancel()
			<-done
			return nil
		}
	}
}

// TestPartitioned: a partitioned table is followed under its own name:
// Setup publishes via the partition root (and sets that on a publication
// made without it), and every change of a partition reaches the table's
// Guard.
func TestPartitioned(t *testing.T) {
	t.Parallel()
	const rows = 200
	c := redistest.Connect(t)
	fx := newPartitioned(t, os.Getenv(envPG), c, redistest.Connect(t), c.Prefix, rows, 3)
	fx.exec("ALTER PUBLICATION " + fx.name + " SET (publish_via_partition_root = false)")
	// Control: published by partition (as Setup used to leave it), the table
	// cannot be followed, and ADD TABLE (the advice Run then gave) is refused.
	g := fx.guard(fx.rdb)
	before, err := pgfollow.New(fx.url, fx.table(g), &pgfollow.Options{Slot: fx.name, Publication: fx.name})
	if err != nil {
		t.Fatal(err)
	}
	if err := runUntilFollowing(before); !errors.Is(err, pgfollow.ErrSetup) {
		t.Fatalf("control: Run on a publication without publish_via_partition_root: %v, want ErrSetup", err)
	}
	if _, err := fx.pool.Exec(context.Background(), "ALTER PUBLICATION "+fx.name+" ADD TABLE "+fx.name); err == nil {
		t.Fatal("control: PostgreSQL accepted ADD TABLE of a partitioned table it publishes by partition")
	}
	if err := pgfollow.Setup(context.Background(), fx.url, &pgfollow.Options{Slot: fx.name, Publication: fx.name}, fx.name); err != nil {
		t.Fatalf("Setup on a publication without publish_via_partition_root: %v", err)
	}
	f, _ := fx.follow(g)
	fx.warm(rows)
	fx.burst(0, rows, nil)
	fx.exec("INSERT INTO " + fx.name + " VALUES ('new', 7)")
	fx.exec("DELETE FROM " + fx.name + " WHERE id = 'id0'")
	fx.caughtUp(f)
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d of %d rows stale", n, rows-1)
	}
	if v, err := fx.get("new"); err != nil || v != 7 {
		t.Fatalf("Get new = %d, %v; want 7 (inserted into a partition)", v, err)
	}
	if _, err := fx.get("id0"); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get id0: %v, want ErrNotFound (deleted from a partition)", err)
	}
}

// slotActive reports whether a follower consumes the fixture's slot.
func (fx *fixture) slotActive() bool {
	var active bool
	err := fx.pool.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", fx.name).Scan(&active)
	return err == nil && active
}

// confirmed is the slot's confirmed position.
func (fx *fixture) confirmed() uint64 {
	var n uint64
	err := fx.pool.QueryRow(context.Background(),
		"SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", fx.name).Scan(&n)
	if err != nil {
		fx.t.Fatal(err)
	}
	return n
}

// TestClosedGuardEndsRun: a Guard closed under the follower ends Run with
// guard.ErrClosed (no retry mends it), the change left unconfirmed.
func TestClosedGuardEndsRun(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 1)
	g := fx.guard(fx.rdb)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := pgfollow.New(fx.url, fx.table(g), &pgfollow.Options{Slot: fx.name, Publication: fx.name})
	if err != nil {
		t.Fatal(err)
	}
	before := fx.confirmed()
	fx.exec("UPDATE " + fx.name + " SET v = 1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.Run(ctx); !errors.Is(err, guard.ErrClosed) {
		t.Fatalf("Run: %v, want guard.ErrClosed", err)
	}
	if after := fx.confirmed(); after != before {
		t.Fatalf("the slot moved from %d to %d: a change was confirmed that no Guard applied", before, after)
	}
}

// logs is a slog handler that keeps every record, for a test to read.
type logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logs) WithGroup(string) slog.Handler      { return l }

// TestNullKey: a key column that may be NULL (a unique email, REPLICA
// IDENTITY FULL). A row with a NULL key has no ID: an UPDATE giving it a
// value adds that ID (the filter built before would answer "not found"),
// one setting it to NULL deletes the old ID (answered "not found" without
// a load), and changes of rows whose key stays NULL write nothing. None is
// a warning. A key TOASTed and unchanged is still read from the old tuple.
// Control: with the follower stopped, the UPDATE giving a key a value
// leaves that ID "not found", as the follower once did.
func TestNullKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fx := newOn(t, 5)
	long := strings.Repeat("0123456789abcdef", 150) // 2,400 bytes: stored out of line, and under a B-tree entry's limit
	fx.exec("ALTER TABLE " + fx.name + " ADD COLUMN email text UNIQUE")
	fx.exec("ALTER TABLE " + fx.name + " ALTER COLUMN email SET STORAGE EXTERNAL")
	fx.exec("ALTER TABLE " + fx.name + " REPLICA IDENTITY FULL")
	fx.exec("UPDATE "+fx.name+" SET email = $1 WHERE id = 'id2'", "m2@x")
	fx.exec("UPDATE "+fx.name+" SET email = $1 WHERE id = 'id4'", long)
	mail := func() *guard.Guard {
		g, err := guard.New(ctx, fx.rdb, "mail", &guard.Options{KeyPrefix: fx.prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	var l logs
	followed := mail()
	follow := func() (*pgfollow.Follower, func()) {
		f, err := pgfollow.New(fx.url, []pgfollow.Table{{Name: fx.name, Key: "email", Guard: followed}},
			&pgfollow.Options{Slot: fx.name, Publication: fx.name, Logger: slog.New(&l)})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(runCtx) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("Run: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		return f, stop
	}
	f, stop := follow()
	waitFor(t, "the follower's position in redis (its first start drops the entries)", func() bool {
		n, err := fx.rdb.Exists(ctx, fx.prefix+":mail:pos:pgfollow:"+fx.name).Result()
		return err == nil && n == 1
	})
	reader := mail()
	emails := func(yield func(string, error) bool) {
		for _, e := range []string{"m2@x", long} {
			if !yield(e, nil) {
				return
			}
		}
	}
	if _, err := reader.Rebuild(ctx, emails, nil); err != nil {
		t.Fatal(err)
	}
	loads := 0
	load := func(ctx context.Context, email string) (int, error) {
		loads++
		var v int
		err := fx.pool.QueryRow(ctx, "SELECT v FROM "+fx.name+" WHERE email = $1", email).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, guard.ErrNotFound
		}
		return v, err
	}
	want := func(email string, v int) {
		t.Helper()
		if got, err := guard.Get(ctx, reader, email, load); err != nil || got != v {
			t.Fatalf("Get %.20s = %d, %v; want %d", email, got, err, v)
		}
	}
	want("m2@x", 0)
	want(long, 0)
	waitFor(t, "the rows to be cached", func() bool {
		n, err := fx.rdb.Exists(ctx, fx.prefix+":mail:{m2@x}").Result()
		return err == nil && n == 1
	})
	step := func(sql string) {
		t.Helper()
		fx.exec(strings.ReplaceAll(sql, "{t}", fx.name))
		fx.caughtUp(f)
	}

	// NULL → a value: an insert. The control first: committed, not applied.
	stop()
	fx.exec("UPDATE " + fx.name + " SET email = 'n1@x', v = 1 WHERE id = 'id1'")
	before := loads
	if ok, err := reader.MayExist(ctx, "n1@x"); err != nil || ok {
		t.Fatalf("control: MayExist n1@x = %v, %v before the follower applied its UPDATE; want false", ok, err)
	}
	if _, err := guard.Get(ctx, reader, "n1@x", load); !errors.Is(err, guard.ErrNotFound) || loads != before {
		t.Fatalf("control: Get n1@x before the follower applied its UPDATE: %v with %d loads; want a false "+
			"ErrNotFound without a load", err, loads-before)
	}
	f, _ = follow()
	fx.caughtUp(f)
	if ok, err := reader.MayExist(ctx, "n1@x"); err != nil || !ok {
		t.Fatalf("MayExist n1@x = %v, %v after its key went from NULL to a value; want true", ok, err)
	}
	want("n1@x", 1)

	step("UPDATE {t} SET email = NULL, v = 2 WHERE id = 'id2'") // a value → NULL: a delete of the old ID
	before = loads
	for range 2 {
		if _, err := guard.Get(ctx, reader, "m2@x", load); !errors.Is(err, guard.ErrNotFound) || loads > before+1 {
			t.Fatalf("Get m2@x after its key went to NULL: %v with %d loads; want ErrNotFound, one load, then the marker",
				err, loads-before)
		}
	}

	changes := f.Stats().Changes
	step("UPDATE {t} SET v = 3 WHERE id = 'id3'") // NULL → NULL
	step("INSERT INTO {t} VALUES ('id9', 9, NULL)")
	step("DELETE FROM {t} WHERE id = 'id9'")
	if got := f.Stats().Changes; got != changes {
		t.Fatalf("%d changes applied for rows whose key stayed NULL, want 0", got-changes)
	}

	step("UPDATE {t} SET v = 4 WHERE id = 'id4'") // the key TOASTed and unchanged: the old tuple has it
	want(long, 4)

	l.mu.Lock()
	defer l.mu.Unlock()
	nulls := map[string]bool{} // the setting of the emails above, replayed from the slot, adds lines of its own
	ids := map[string]bool{}   // the IDs on the lines about one, with the line's end
	for _, r := range l.recs {
		if r.Level >= slog.LevelWarn {
			t.Errorf("logged at %v: %s", r.Level, r.Message)
		}
		if strings.Contains(r.Message, "NULL") {
			nulls[r.Message] = true
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "id" {
				ids[r.Message[strings.LastIndex(r.Message, ":")+2:]+" "+a.Value.String()] = true
			}
			return true
		})
	}
	if len(nulls) != 4 {
		t.Errorf("log lines %q; want 4 kinds, saying what each kind of change above did", slices.Collect(maps.Keys(nulls)))
	}
	if !ids["its ID added n1@x"] || !ids["its old ID deleted m2@x"] {
		t.Errorf("the lines about one ID, with it: %q; want n1@x added and m2@x deleted", slices.Collect(maps.Keys(ids)))
	}
}

// loseSlot makes PostgreSQL invalidate the fixture's slot, on a server
// whose max_slot_wal_keep_size is small: WAL switched and checkpointed past
// it until wal_status is lost.
func (fx *fixture) loseSlot() {
	fx.t.Helper()
	waitFor(fx.t, "the slot to be lost", func() bool {
		fx.exec("SELECT pg_switch_wal()")
		fx.exec("CHECKPOINT") // removes the WAL past the limit: the slot is invalidated
		var status string
		err := fx.pool.QueryRow(context.Background(), "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", fx.name).Scan(&status)
		return err == nil && status == "lost"
	})
}

// TestSlotLost: changes made while no follower runs, past the WAL that
// max_slot_wal_keep_size lets the slot keep: PostgreSQL invalidates the
// slot. Run ends with ErrSlotLost, whether the slot was lost before the
// check or between the check and START_REPLICATION, and Recover makes a
// new slot and drops and rebuilds the Guard: no row stale, the row
// inserted meanwhile found, and the changes after it followed.
func TestSlotLost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server of its own")
	}
	const rows = 100
	_, fx := newPrivate(t, rows, "max_slot_wal_keep_size=1MB")
	g := fx.guard(fx.rdb)
	first, stop := fx.follow(g)
	fx.warm(rows)
	fx.caughtUp(first)
	stop()
	fx.burst(0, 50, nil)
	fx.exec("INSERT INTO " + fx.name + " VALUES ('new', 7)")
	if n := fx.stale(); n != 51 {
		t.Fatalf("%d rows stale with no follower, want 51 (50 updated, 1 inserted)", n)
	}

	url, started, release := holdStart(t, fx.url)
	f, err := pgfollow.New(url, fx.table(g), &pgfollow.Options{Slot: fx.name, Publication: fx.name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound, should Run retry for ever
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- f.Run(ctx) }()
	select {
	case <-started: // checked, and its START_REPLICATION held
	case err := <-ran:
		t.Fatalf("Run ended before its START_REPLICATION: %v", err)
	}
	fx.loseSlot()
	release()
	if err := <-ran; !errors.Is(err, pgfollow.ErrSlotLost) || !strings.Contains(err.Error(), "START_REPLICATION") {
		t.Fatalf("Run, the slot lost after the check: %v; want ErrSlotLost from START_REPLICATION", err)
	}
	err = f.Run(ctx)
	if !errors.Is(err, pgfollow.ErrSlotLost) || !strings.Contains(err.Error(), "wal_status lost") || !strings.Contains(err.Error(), "-recover") {
		t.Fatalf("Run on a lost slot: %v; want ErrSlotLost saying wal_status lost and how to recover", err)
	}
	t.Log(err)
	if n := fx.stale(); n != 51 {
		t.Fatalf("%d rows stale before Recover, want 51", n)
	}
	if err := f.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d rows stale after Recover", n)
	}
	if v, err := fx.get("new"); err != nil || v != 7 {
		t.Fatalf("Get new = %d, %v after Recover; want 7", v, err)
	}
	fx.exec("UPDATE " + fx.name + " SET v = 100 WHERE id = 'id99'") // before Run: the new slot keeps it
	f, _ = fx.follow(g)
	fx.burst(0, 50, nil)
	fx.caughtUp(f)
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d rows stale, following the new slot", n)
	}
}

// holdStart is a TCP proxy to the PostgreSQL server of url (sslmode=disable)
// that holds the first START_REPLICATION it carries, until release: started
// is closed then, when a follower has checked its set-up and not begun its
// stream. It returns the URL through the proxy.
func holdStart(t *testing.T, url string) (proxied string, started <-chan struct{}, release func()) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upstream := u.Host
	at, resume := make(chan struct{}), make(chan struct{})
	var held, released sync.Once
	release = func() { released.Do(func() { close(resume) }) }
	hold := func() { held.Do(func() { close(at); <-resume }) }
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn // closed at the end
	closed := false
	t.Cleanup(func() {
		_ = ln.Close()
		release()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			mu.Lock()
			if err != nil || closed {
				mu.Unlock()
				_ = c.Close()
				if up != nil {
					_ = up.Close()
				}
				continue
			}
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
			wg.Go(func() { _ = forwardHolding(up, c, hold); _ = up.Close() })
		}
	})
	u.Host = ln.Addr().String()
	return u.String(), at, release
}

// forwardHolding copies a client's messages to the server, calling hold
// before it forwards a START_REPLICATION (a simple Query).
func forwardHolding(dst io.Writer, src io.Reader, hold func()) error {
	r := bufio.NewReader(src)
	for startup := true; startup; { // untyped: an encryption request (the server answers 'N'), then the startup message
		msg, err := readMessage(r, 0)
		if err != nil {
			return err
		}
		code := binary.BigEndian.Uint32(msg[4:])
		startup = code == 80877103 || code == 80877104 // SSLRequest, GSSENCRequest
		if _, err := dst.Write(msg); err != nil {
			return err
		}
	}
	for {
		msg, err := readMessage(r, 1)
		if err != nil {
			return err
		}
		if msg[0] == 'Q' && bytes.HasPrefix(msg[5:], []byte("START_REPLICATION")) {
			hold()
		}
		if _, err := dst.Write(msg); err != nil {
			return err
		}
	}
}

// readMessage reads one protocol message: its type byte (typed: 1), its
// length and its body.
func readMessage(r *bufio.Reader, typed int) ([]byte, error) {
	head := make([]byte, typed+4)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[typed:]))
	if n < 8-4*typed {
		return nil, fmt.Errorf("a message of length %d", n)
	}
	msg := append(head, make([]byte, n-4)...)
	_, err := io.ReadFull(r, msg[typed+4:])
	return msg, err
}

// TestSetupGrants: -create (Setup) as a role with REPLICATION alone: the
// publication needs CREATE on the database and the table's ownership.
// Setup ends with ErrSetup giving the grants; the test runs them as an
// administrator would, and Setup then succeeds. The role then follows.
func TestSetupGrants(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 1)
	url := os.Getenv(envPG)
	n := fx.name
	fx.exec("CREATE ROLE " + n + "_rep LOGIN REPLICATION")
	role := strings.Replace(url, "postgres@", n+"_rep@", 1)
	opts := &pgfollow.Options{Slot: n + "_g", Publication: n + "_g"}
	t.Cleanup(func() { _ = pgfollow.DropSlot(context.Background(), url, n+"_g") })
	err := pgfollow.Setup(context.Background(), role, opts, n)
	_, fixes, ok := strings.Cut(fmt.Sprint(err), "(or run -create once as a superuser): ")
	if !errors.Is(err, pgfollow.ErrSetup) || !ok || !strings.Contains(fixes, "GRANT CREATE ON DATABASE") {
		t.Fatalf("Setup without the grants: %v; want ErrSetup giving them", err)
	}
	for _, sql := range strings.Split(fixes, "; ") {
		fx.exec(sql)
	}
	if err := pgfollow.Setup(context.Background(), role, opts, n); err != nil {
		t.Fatalf("Setup after %s: %v", fixes, err)
	}
	f, err := pgfollow.New(role, fx.table(fx.guard(fx.rdb)), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	waitFor(t, "the role to follow", func() bool { return f.Stats().Following })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run as the role: %v", err)
	}
}
