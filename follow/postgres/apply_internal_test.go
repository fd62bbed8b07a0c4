package pgfollow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestApplySkipsWhatATruncateEnds: a batch (or a replay after a Redis
// rollback) holding a DELETE of x, then a TRUNCATE, then an INSERT of x
// writes nothing of x before the TRUNCATE's reset, which drops every entry
// and rebuilds the filter from the table: the DELETE before it is left
// out, where it used to be written first, a marker Gets read until the
// reset (chaos seed 4 on a cluster). Control: the DELETE alone is written,
// which the test sees.
func TestApplySkipsWhatATruncateEnds(t *testing.T) {
	ctx := context.Background()
	url, name, _ := tableOfX(t)
	c := redistest.Connect(t)
	rec := &scripts{}
	rdb := redistest.NewClient()
	rdb.AddHook(rec)
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "item", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	f, err := New(url, []Table{{Name: name, Guard: g}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tbl := f.tables[qualified(name)]
	f.keys = map[string]string{tbl.Name: "id"}
	for _, truncate := range []bool{true, false} {
		txs := []txn{{changes: []change{{t: tbl, op: opDelete, key: "x"}}}}
		if truncate {
			txs = append(txs, txn{changes: []change{{t: tbl, op: opTruncate}}}, txn{changes: []change{{t: tbl, op: opInsert, key: "x"}}})
		}
		rec.reset()
		if err := f.apply(ctx, txs); err != nil {
			t.Fatal(err)
		}
		if early := rec.before("{x}", "scan"); early == truncate {
			t.Errorf("TRUNCATE %v: x written before the reset (or without one): %v, want %v", truncate, early, !truncate)
		}
	}
}

// scripts records the commands a client sends, in order.
type scripts struct {
	mu   sync.Mutex
	cmds []string
}

func (s *scripts) reset() { s.mu.Lock(); s.cmds = nil; s.mu.Unlock() }

// before reports whether a command naming part was sent before the first
// command named name (or with none sent).
func (s *scripts) before(part, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cmds {
		if strings.HasPrefix(c, name+" ") {
			return false
		}
		if strings.Contains(c, part) {
			return true
		}
	}
	return false
}

func (s *scripts) note(cmds ...redis.Cmder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cmds {
		s.cmds = append(s.cmds, strings.ToLower(fmt.Sprintln(c.Args()...)))
	}
}

func (s *scripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { s.note(cmd); return next(ctx, cmd) }
}
func (s *scripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { s.note(cmds...); return next(ctx, cmds) }
}

// TestResentDeleteHidesNoRow: a DELETE re-sent after the row was created
// again (a reconnect resumes from the slot's confirmed position; a replay
// after a rollback) must not make Gets answer "not found" for the row that
// exists: the follower invalidates a deleted row instead of writing a
// marker. Chaos seed 7 found a Delete's marker hiding a re-created row
// right after a PostgreSQL restart (12 false not-found in 10 minutes).
func TestResentDeleteHidesNoRow(t *testing.T) {
	ctx := context.Background()
	url, name, pool := tableOfX(t)
	c := redistest.Connect(t)
	g, err := guard.New(ctx, c, "item", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, guard.IDs([]string{"x"}), nil); err != nil {
		t.Fatal(err)
	}
	f, err := New(url, []Table{{Name: name, Guard: g}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tbl := f.tables[qualified(name)]
	load := func(ctx context.Context, id string) (int, error) {
		var v int
		err := pool.QueryRow(ctx, fmt.Sprintf("SELECT v FROM %s WHERE id = $1", name), id).Scan(&v)
		return v, err
	}
	if v, err := guard.Get(ctx, g, "x", load); err != nil || v != 7 { // cached, as a reader would have it
		t.Fatalf("Get x: %d, %v", v, err)
	}
	// The DELETE of x, committed before x was created again, comes again.
	if err := f.apply(ctx, []txn{{changes: []change{{t: tbl, op: opDelete, key: "x"}}}}); err != nil {
		t.Fatal(err)
	}
	v, err := guard.Get(ctx, g, "x", load)
	if err != nil || v != 7 {
		t.Fatalf("Get x after a re-sent DELETE: %d, %v; want 7 (the row exists)", v, err)
	}
}

// tableOfX creates a table of its own on the package's server, holding the
// row x (v 7), and returns the server's URL, the table's name and a pool.
func tableOfX(t *testing.T) (url, name string, pool *pgxpool.Pool) {
	t.Helper()
	url = os.Getenv("CG_TEST_PGFOLLOW_URL")
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name = "t" + hex.EncodeToString(b)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sql := fmt.Sprintf("CREATE TABLE %s (id text PRIMARY KEY, v int); INSERT INTO %[1]s VALUES ('x', 7)", name)
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
	return url, name, pool
}
