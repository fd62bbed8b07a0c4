package pgfollow_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// The package's PostgreSQL server (wal_level=logical), shared by the tests
// (each on tables, slots and publications of its own); children started by
// Spawn find its URL in the environment.
const envPG = "CG_TEST_PGFOLLOW_URL"

func TestMain(m *testing.M) {
	if redistest.IsChild() {
		os.Exit(redistest.Run(m, roles))
	}
	srv, err := startLogical()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv(envPG, srv.URL("postgres"))
	code := redistest.Run(m, roles)
	srv.Remove()
	os.Exit(code)
}

// startLogical starts a PostgreSQL server set up for followers, with more
// settings if given.
func startLogical(settings ...string) (*pgserver.Server, error) {
	return pgserver.Start(append([]string{"wal_level=logical", "max_wal_senders=40", "max_replication_slots=40"}, settings...)...)
}

// fixture is one table (id text primary key, v int), its slot and
// publication (all named name), and a reader: a Guard in "another process"
// (a client of its own) that loads from the table.
type fixture struct {
	t      testing.TB
	name   string
	url    string
	pool   *pgxpool.Pool
	prefix string
	rdb    redis.UniversalClient // the follower's Redis (the reader's too, through a client of its own)
	reader *guard.Guard
	loads  sync.Map         // id → loads of it by the reader
	log    *slog.Logger     // the next followers' (nil: slog.Default())
	insp   pgfollow.Inspect // the next followers' inspector (zero: the default)
}

// newFixture creates a table of rows id0..id(rows-1), v 0, on the server at
// url, with its publication and slot, and the reader on rdb's server.
func newFixture(t testing.TB, url string, rdb, readerRDB redis.UniversalClient, prefix string, rows int) *fixture {
	t.Helper()
	return newPartitioned(t, url, rdb, readerRDB, prefix, rows, 0)
}

// newPartitioned is newFixture with the table partitioned by a hash of id
// into partitions tables (0: not partitioned).
func newPartitioned(t testing.TB, url string, rdb, readerRDB redis.UniversalClient, prefix string, rows, partitions int) *fixture {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	fx := &fixture{t: t, name: "t" + hex.EncodeToString(b), url: url, prefix: prefix, rdb: rdb}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	fx.pool = pool
	if partitions == 0 {
		fx.exec(fmt.Sprintf("CREATE TABLE %s (id text PRIMARY KEY, v int NOT NULL)", fx.name))
	} else {
		fx.exec(fmt.Sprintf("CREATE TABLE %s (id text PRIMARY KEY, v int NOT NULL) PARTITION BY HASH (id)", fx.name))
	}
	for i := range partitions {
		fx.exec(fmt.Sprintf("CREATE TABLE %s_%d PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d)", fx.name, i, fx.name, partitions, i))
	}
	fx.exec(fmt.Sprintf("INSERT INTO %s SELECT 'id' || i, 0 FROM generate_series(0, %d) i", fx.name, rows-1))
	opts := &pgfollow.Options{Slot: fx.name, Publication: fx.name}
	if err := pgfollow.Setup(ctx, url, opts, fx.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // once no follower consumes it: a killed one's server process may linger a moment
		var err error
		waitFor(t, "the slot to be dropped", func() bool {
			err = pgfollow.DropSlot(context.Background(), url, fx.name)
			return err == nil
		})
	})
	fx.reader = fx.guard(readerRDB)
	if _, err := fx.reader.Rebuild(ctx, fx.ids(ctx), nil); err != nil {
		t.Fatal(err)
	}
	return fx
}

func (fx *fixture) exec(sql string, args ...any) {
	fx.t.Helper()
	if _, err := fx.pool.Exec(context.Background(), sql, args...); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
}

// guard opens the table's Guard on rdb, closed when the test ends.
func (fx *fixture) guard(rdb redis.UniversalClient) *guard.Guard {
	fx.t.Helper()
	g, err := guard.New(context.Background(), rdb, "item", &guard.Options{
		KeyPrefix: fx.prefix, Filter: guard.FilterOptions{ExpectedItems: 100_000},
	})
	if err != nil {
		fx.t.Fatal(err)
	}
	fx.t.Cleanup(func() { _ = g.Close() })
	return g
}

// ids lists the table's IDs (Table.IDs, Rebuild).
func (fx *fixture) ids(ctx context.Context) iter.Seq2[string, error] {
	return guard.Rows(fx.pool.Query(ctx, "SELECT id FROM "+fx.name))
}

// load is the reader's load function.
func (fx *fixture) load(ctx context.Context, id string) (int, error) {
	n, _ := fx.loads.LoadOrStore(id, new(int64))
	*n.(*int64)++ // the reader's Gets run one at a time
	var v int
	err := fx.pool.QueryRow(ctx, "SELECT v FROM "+fx.name+" WHERE id = $1", id).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, guard.ErrNotFound
	}
	return v, err
}

// loadMany is the reader's load function for GetMany.
func (fx *fixture) loadMany(ctx context.Context, ids []string) (map[string]int, error) {
	rows, err := fx.pool.Query(ctx, "SELECT id, v FROM "+fx.name+" WHERE id = ANY($1)", ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var id string
		var v int
		if err := rows.Scan(&id, &v); err != nil {
			return nil, err
		}
		m[id] = v
	}
	return m, rows.Err()
}

// getMany reads ids through the reader, 500 at a time.
func (fx *fixture) getMany(ids []string) map[string]int {
	fx.t.Helper()
	got := map[string]int{}
	for len(ids) > 0 {
		n := min(len(ids), 500)
		m, err := guard.GetMany(context.Background(), fx.reader, ids[:n], fx.loadMany)
		for try := 0; errors.Is(err, guard.ErrUnavailable) && try < 50; try++ {
			// Redis slow to answer on a loaded machine: not an answer to count, so read again.
			time.Sleep(100 * time.Millisecond)
			m, err = guard.GetMany(context.Background(), fx.reader, ids[:n], fx.loadMany)
		}
		if err != nil {
			fx.t.Fatalf("GetMany: %v", err)
		}
		for id, v := range m {
			got[id] = v
		}
		ids = ids[n:]
	}
	return got
}

// get is a Get through the reader.
func (fx *fixture) get(id string) (int, error) {
	return guard.Get(context.Background(), fx.reader, id, fx.load)
}

// table is the follower's view of the fixture, on g.
func (fx *fixture) table(g *guard.Guard) []pgfollow.Table {
	return []pgfollow.Table{{Name: fx.name, Guard: g}}
}

// follow runs a follower of the fixture on g until the returned stop (or
// the test's end).
func (fx *fixture) follow(g *guard.Guard) (*pgfollow.Follower, func()) {
	fx.t.Helper()
	return fx.followOn(fx.url, g)
}

func (fx *fixture) followOn(url string, g *guard.Guard, before ...func(*pgfollow.Follower)) (*pgfollow.Follower, func()) {
	fx.t.Helper()
	f, err := pgfollow.New(url, fx.table(g), &pgfollow.Options{Slot: fx.name, Publication: fx.name, Logger: fx.log, Inspect: fx.insp})
	if err != nil {
		fx.t.Fatal(err)
	}
	for _, fn := range before {
		fn(f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				fx.t.Errorf("Run: %v, want context.Canceled", err)
			}
		})
	}
	fx.t.Cleanup(stop)
	fx.positioned()
	return f, stop
}

// positioned waits until a follower of the fixture has started: it holds
// the slot and has set its position in Redis (its first start drops the
// Guard's entries: warm the reader after it).
func (fx *fixture) positioned() {
	fx.t.Helper()
	waitFor(fx.t, "the follower's position in redis", func() bool { // read as the follower reads it (every copy, on a Cluster)
		pos, err := fx.reader.Feed().Position(context.Background(), "pgfollow:"+fx.name)
		return err == nil && pos > 0
	})
}

// caughtUp waits until f has applied every change committed so far.
func (fx *fixture) caughtUp(f *pgfollow.Follower) {
	fx.t.Helper()
	var s string
	if err := fx.pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		fx.t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		fx.t.Fatal(err)
	}
	waitFor(fx.t, fmt.Sprintf("the follower to apply up to %s", lsn), func() bool { return f.Stats().AppliedLSN >= uint64(lsn) })
}

// stale counts the rows the reader answers with a value other than the
// table's (reads made after every write committed).
func (fx *fixture) stale() int {
	fx.t.Helper()
	rows, err := fx.pool.Query(context.Background(), "SELECT id, v FROM "+fx.name)
	if err != nil {
		fx.t.Fatal(err)
	}
	want := map[string]int{}
	var ids []string
	for rows.Next() {
		var id string
		var v int
		if err := rows.Scan(&id, &v); err != nil {
			fx.t.Fatal(err)
		}
		want[id], ids = v, append(ids, id)
	}
	rows.Close()
	got := fx.getMany(ids)
	n := 0
	for id, v := range want {
		if g, ok := got[id]; !ok || g != v {
			n++
		}
	}
	return n
}

// warm caches every row (id0..id(rows-1)) in the reader.
func (fx *fixture) warm(rows int) {
	fx.t.Helper()
	ids, keys := make([]string, rows), make([]string, rows)
	for i := range ids {
		ids[i], keys[i] = fmt.Sprintf("id%d", i), fmt.Sprintf("%s:item:{id%d}", fx.prefix, i)
	}
	if got := fx.getMany(ids); len(got) != rows {
		fx.t.Fatalf("warm: %d rows, want %d", len(got), rows)
	}
	waitFor(fx.t, "the rows to be cached", func() bool { // the flights write after they answer
		pipe := fx.rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.Exists(context.Background(), k)
		}
		_, _ = pipe.Exec(context.Background())
		for _, c := range cmds {
			if c.Val() != 1 {
				return false
			}
		}
		return true
	})
}

// burst runs n single-row UPDATEs, each its own transaction, of rows
// id(from)..id(from+n-1), each once (a lost change then shows as a stale
// row, never masked by a later change of the row), calling at(i) before
// the i-th.
func (fx *fixture) burst(from, n int, at func(i int)) {
	fx.t.Helper()
	for i := range n {
		if at != nil {
			at(i)
		}
		fx.exec("UPDATE "+fx.name+" SET v = v + 1 WHERE id = $1", fmt.Sprintf("id%d", from+i))
	}
}

// waitFor polls cond (every 5 ms, up to 30 s): the state a test needs.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitUntil(t, what, time.Now().Add(30*time.Second), cond)
}

// waitUntil polls cond until deadline, then fails the test.
func waitUntil(t testing.TB, what string, deadline time.Time, cond func() bool) {
	t.Helper()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (until %v)", what, deadline.Format(time.TimeOnly))
		}
		time.Sleep(5 * time.Millisecond) // polling a state the test does not own (the server's, the follower's)
	}
}

// roles are the child processes the tests start (redistest.Spawn).
var roles = map[string]func(rdb redis.UniversalClient) int{
	// follow runs a follower of the table in CG_TEST_TABLE (Guards under
	// CG_TEST_PREFIX) until it is killed: by the test, or by itself (SIGKILL)
	// as its CG_TEST_KILL_AT-th batch is about to be applied (killAt).
	"follow": func(rdb redis.UniversalClient) int {
		ctx := context.Background()
		name, prefix := os.Getenv("CG_TEST_TABLE"), os.Getenv("CG_TEST_PREFIX")
		if at, _ := strconv.Atoi(os.Getenv("CG_TEST_KILL_AT")); at > 0 {
			rdb.AddHook(&killAt{batch: at, pos: prefix + ":item:pos:pgfollow:" + name})
		}
		g, err := guard.New(ctx, rdb, "item", &guard.Options{KeyPrefix: prefix, Filter: guard.FilterOptions{ExpectedItems: 100_000}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		f, err := pgfollow.New(os.Getenv(envPG), []pgfollow.Table{{Name: name, Guard: g}}, &pgfollow.Options{Slot: name, Publication: name})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		err = f.Run(ctx)
		fmt.Fprintln(os.Stderr, err)
		return 1
	},
}

// killAt is a redis.Hook that SIGKILLs its process as the follower's
// batch-th batch is about to be applied: as the first pipeline of DELs
// (a batch of UPDATEs' Invalidate) after a set of the follower's position
// is about to be sent. The follower sets its position after each batch
// landed (and once as it starts, after its repair): the batch is received,
// nothing of it written, nothing of it confirmed.
type killAt struct {
	batch int
	pos   string // the follower's position key

	mu      sync.Mutex
	batches int  // batches begun
	set     bool // the position was set since the last batch began
}

func (k *killAt) DialHook(next redis.DialHook) redis.DialHook { return next }
func (k *killAt) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(a) > 3 && a[3] == k.pos {
			k.mu.Lock()
			k.set = true
			k.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (k *killAt) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "del" }) {
			k.mu.Lock()
			begins := k.set
			if begins {
				k.set = false
				k.batches++
			}
			kill := begins && k.batches == k.batch
			k.mu.Unlock()
			if kill {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
		return next(ctx, cmds)
	}
}
