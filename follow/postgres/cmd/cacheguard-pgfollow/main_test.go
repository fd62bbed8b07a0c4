package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cacheguard/cacheguard/guard"
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
	srv, err := pgserver.Start("wal_level=logical")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	pool, err := pgxpool.New(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, sql := range []string{"CREATE TABLE products (id text PRIMARY KEY, v int)", "INSERT INTO products VALUES ('p1', 1)"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	c := redistest.Connect(t)
	reader, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	load := func(ctx context.Context, id string) (int, error) {
		var v int
		err := pool.QueryRow(ctx, "SELECT v FROM products WHERE id = $1", id).Scan(&v)
		return v, err
	}
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Server(t)
	args := []string{"-pg", srv.URL("postgres"), "-redis", "unix://" + rs.Addr, "-prefix", c.Prefix,
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
	waitFor(t, "the follower's position in redis (its first start drops the entries)", func() bool {
		return c.Exists(ctx, c.Prefix+":product:pos:pgfollow:cacheguard").Val() == 1
	})
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
	for _, m := range []string{"cacheguard_pgfollow_lag_bytes", "cacheguard_pgfollow_changes_total 1"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("metrics lack %q:\n%s", m, body)
		}
	}
}

// TestUsage: -h says what PostgreSQL needs.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &out); code != 2 {
		t.Fatalf("exit %d", code)
	}
	for _, s := range []string{"wal_level = logical", "REPLICATION", "REPLICA IDENTITY", "-drop-slot"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("usage lacks %q", s)
		}
	}
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
