package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	_ "image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// newTestShop serves the shop on a fresh SQLite file and a private
// redis-server, its Echo routes on Echo v5 or, with echoVersion 4, v4.
func newTestShop(t *testing.T, products, users int, echoVersion ...int) (*Shop, *httptest.Server) {
	t.Helper()
	ctx := context.Background()
	srv, err := redisserver.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	db, err := openStore(ctx, filepath.Join(t.TempDir(), "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := seed(ctx, db, products, users); err != nil {
		t.Fatal(err)
	}
	shop, err := newShop(ctx, db, srv.Options(), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	version := 5
	if len(echoVersion) > 0 {
		version = echoVersion[0]
	}
	hs := httptest.NewServer(shop.Handler(version))
	t.Cleanup(func() { hs.Close(); shop.Close() })
	return shop, hs
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProductLifecycle: create → read → update → read (the new value, never
// the old) → delete → read (404), plus users, metrics and health; on Echo
// v5 (the default) and on Echo v4, each with its adapter.
func TestProductLifecycle(t *testing.T) {
	for _, v := range []int{5, 4} {
		t.Run("echo v"+strconv.Itoa(v), func(t *testing.T) {
			shop, hs := newTestShop(t, 1000, 100, v)
			lifecycle(t, shop, hs)
			// Request errors keep the framework's answer; unknown IDs
			// the adapter's problem.
			if code, _ := do(t, "POST", hs.URL+"/products", `{"price_cents":1}`); code != 400 {
				t.Fatalf("create without a name: %d", code)
			}
			if code, body := do(t, "GET", hs.URL+"/naive/products/x", ""); code != 400 {
				t.Fatalf("naive, malformed id: %d %s", code, body)
			}
			// The filter lifecycle deleted is rebuilt by the Guard itself (Filter.IDs):
			// until then an unknown ID answers 503 (the copy of the filter never saw it).
			waitReady(t, shop.products)
			real, rejected := hs.URL+"/naive/products/99999999", hs.URL+"/products/99999999"
			if c1, b1 := do(t, "GET", real, ""); c1 != 404 {
				t.Fatalf("naive, unknown: %d %s", c1, b1)
			} else if c2, b2 := do(t, "GET", rejected, ""); c2 != 404 || b1 != b2 {
				t.Fatalf("guarded, unknown: %d %s; naive said %s", c2, b2, b1)
			}
		})
	}
}

func lifecycle(t *testing.T, shop *Shop, hs *httptest.Server) {
	t.Helper()
	ctx := context.Background()
	// Asked for before it exists, while Redis has lost the products'
	// filter: 404 from a load (a "not found" marker), or 503 once the Guard
	// holds its copy of the filter, which never saw the ID. Either way it is
	// served right after the create.
	lost, err := shop.guardRDB.Keys(ctx, "cg:product:bf:*").Result()
	if err != nil || len(lost) == 0 {
		t.Fatalf("filter keys: %v %v", lost, err)
	}
	if err := shop.guardRDB.Del(ctx, lost...).Err(); err != nil {
		t.Fatal(err)
	}
	var next int64
	if err := shop.writes.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) + 1 FROM products`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	nextURL := hs.URL + "/products/" + strconv.FormatInt(next, 10)
	if code, body := do(t, "GET", nextURL, ""); code != 404 && code != 503 {
		t.Fatalf("before its create: %d %s; want 404 or 503", code, body)
	}
	code, body := do(t, "POST", hs.URL+"/products", `{"name":"Desk lamp","price_cents":1999}`)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var p Product
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.ID == "" {
		t.Fatalf("create: %s %v", body, err)
	}
	if p.ID != strconv.FormatInt(next, 10) {
		t.Fatalf("created ID %s, expected %d", p.ID, next)
	}
	url := hs.URL + "/products/" + p.ID
	for range 2 { // a miss, then a hit
		if code, body = do(t, "GET", url, ""); code != 200 || !strings.Contains(body, `"price_cents":1999`) {
			t.Fatalf("read: %d %s", code, body)
		}
	}
	if code, body = do(t, "PUT", url, `{"name":"Desk lamp","price_cents":2499}`); code != 200 {
		t.Fatalf("update: %d %s", code, body)
	}
	for range 3 {
		if code, body = do(t, "GET", url, ""); code != 200 || !strings.Contains(body, `"price_cents":2499`) {
			t.Fatalf("read after update: %d %s", code, body)
		}
	}
	if code, _ = do(t, "DELETE", url, ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if code, body = do(t, "GET", url, ""); code != 404 || !strings.Contains(body, `"status":404`) {
		t.Fatalf("read after delete: %d %s", code, body)
	}
	if code, _ = do(t, "PUT", url, `{"name":"x","price_cents":1}`); code != 404 {
		t.Fatalf("update of a deleted product: %d", code)
	}
	// Deleted, then re-created with the same ID (a restore): served at once.
	if _, err := shop.writes.db.ExecContext(ctx, `INSERT INTO products (id, name, price_cents) VALUES ($1, $2, $3)`, p.ID, "Desk lamp", 999); err != nil {
		t.Fatal(err)
	}
	if err := shop.created(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if code, body = do(t, "GET", url, ""); code != 200 || !strings.Contains(body, `"price_cents":999`) {
		t.Fatalf("read after re-create: %d %s", code, body)
	}

	if code, body = do(t, "GET", hs.URL+"/users/7", ""); code != 200 || !strings.Contains(body, "User 7") {
		t.Fatalf("user: %d %s", code, body)
	}
	queries := shop.store.queries.Load()
	if code, _ = do(t, "GET", hs.URL+"/users/99999", ""); code != 404 || shop.store.queries.Load() != queries {
		t.Fatalf("unknown user: %d, %d queries", code, shop.store.queries.Load()-queries)
	}
	if code, _ = do(t, "GET", hs.URL+"/users/%7Bx%7D", ""); code != 400 {
		t.Fatalf("malformed user id: %d", code)
	}
	if code, body = do(t, "GET", hs.URL+"/metrics", ""); code != 200 ||
		!regexp.MustCompile(`cacheguard_gets_total\{guard="user",outcome="reject"\} 1\n`).MatchString(body) ||
		!strings.Contains(body, `otel_cacheguard_load_duration_seconds_bucket{cacheguard_guard="product",cacheguard_result="ok",le=`) ||
		!strings.Contains(body, `shop_db_queries_total{path="guard"}`) {
		t.Fatalf("metrics: %d\n%s", code, body)
	}
	if code, _ = do(t, "GET", hs.URL+"/healthz", ""); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
}

// TestDemoTable runs the whole `shop demo -exit` briefly, its PostgreSQL
// scenario included, and checks the figures of the tables it prints against
// what the guard promises, and that it logs no warning and no error.
func TestDemoTable(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	var out bytes.Buffer
	var logs redistest.Logs // the demo's stderr: go-redis's logger is process-wide and keeps writing to it
	dir, tmp := t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the demo's temporary SQLite file goes
	chart := filepath.Join(dir, "demo.png")
	err := runServe(context.Background(), true, []string{"-exit", "-duration", "700ms", "-chart", chart}, &out, &logs)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if regexp.MustCompile(`level=(WARN|ERROR)`).MatchString(logs.String()) {
		t.Errorf("the demo logged warnings (its clients and Guards set up as README says, it has none to give):\n%s", logs.String())
	}
	outsideRounds(t, out.String())
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("the demo left files behind in TMPDIR: %v", left)
	}
	t.Log("\n" + out.String())
	f, err := os.Open(chart)
	if err != nil {
		t.Fatalf("the chart was not written: %v", err)
	}
	defer f.Close()
	if img, format, err := image.DecodeConfig(f); err != nil || format != "png" || img.Width < 400 || img.Height < 200 {
		t.Fatalf("chart: %v %q %+v", err, format, img)
	}
	rows := map[string][]int64{}
	re := regexp.MustCompile(`\| (\w+)(?: \((\d+) invalidations\))? \| (\w+) \| (\d+) \| (\d+) \| (\d+) \|`)
	for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
		inval, _ := strconv.ParseInt(m[2], 10, 64)
		req, _ := strconv.ParseInt(m[4], 10, 64)
		dbq, _ := strconv.ParseInt(m[5], 10, 64)
		rows[m[1]+"/"+m[3]] = []int64{req, dbq, inval}
	}
	if len(rows) != 8 {
		t.Fatalf("want 8 rows, got %v", rows)
	}
	// Every row says what a request cost in CPU, in the shop's process and
	// in redis-server (from /metrics: process_cpu_seconds_total and
	// shop_redis_cpu_seconds_total).
	cpu := regexp.MustCompile(`(?m)^\| \w+.* \| (\d+) µs \| (\d+) µs \|$`).FindAllStringSubmatch(out.String(), -1)
	if len(cpu) != 8 {
		t.Fatalf("want CPU per request on 8 rows, got %d:\n%s", len(cpu), out.String())
	}
	for _, m := range cpu {
		if m[1] == "0" || m[2] == "0" {
			t.Fatalf("a path cost no CPU in the shop or in Redis: %q", m[0])
		}
	}
	pn, pg := rows["penetration/naive"], rows["penetration/guard"]
	if pn[0] == 0 || pg[0] == 0 || float64(pg[1])/float64(pg[0]) > 0.02*float64(pn[1])/float64(pn[0]) {
		t.Fatalf("penetration: guard %d queries for %d requests, naive %d for %d", pg[1], pg[0], pn[1], pn[0])
	}
	sn, sg := rows["stampede/naive"], rows["stampede/guard"]
	if sg[2] == 0 || sg[1] != sg[2] {
		t.Fatalf("stampede: guard %d queries for %d invalidations, want one each", sg[1], sg[2])
	}
	if sn[1] < 10*sn[2] {
		t.Fatalf("stampede: the naive path should pay many queries per invalidation: %d for %d", sn[1], sn[2])
	}
	// Each row: its requests per round (median) and the machine's load;
	// each pair: the median of its rounds' ratios, with the load.
	perRound := regexp.MustCompile(`(?m)^\| \w+.* \| \d+ \| (\d+) \| (\d+\.\d\d|n/a) \| \d+ µs \| \d+ µs \|$`)
	if n := len(perRound.FindAllString(out.String(), -1)); n != 8 {
		t.Errorf("want requests per round and load on 8 rows, got %d", n)
	}
	for _, pair := range []string{"penetration guard", "stampede guard", "zipf guard", "zipf local", "zipf refresh"} {
		re := regexp.MustCompile(pair + `: \d+\.\d\d× the naive path's requests ` +
			`\(median of 3 alternated rounds: (\d+\.\d\d× ){2}\d+\.\d\d×; load (\d+\.\d\d|n/a)\)`)
		if !re.MatchString(out.String()) {
			t.Errorf("no median of alternated rounds for %s", pair)
		}
	}
}

// outsideRounds checks the demo's table of the scenario "writes from
// outside the service": rows updated and deleted straight in PostgreSQL are
// stale in the shop without the follower (every one of them: the control),
// and none is stale with it.
func outsideRounds(t *testing.T, out string) {
	t.Helper()
	rounds := regexp.MustCompile(`(?m)^\| (on|off) \| (\d+) \| (\d+) \| [^|]+ \|$`).FindAllStringSubmatch(out, -1)
	if len(rounds) != 2 || rounds[0][1] != "on" || rounds[1][1] != "off" {
		t.Fatalf("want the scenario outside's round with the follower, then one without:\n%s", out)
	}
	for _, r := range rounds {
		want := "0"
		if r[1] == "off" {
			want = r[2]
		}
		if r[2] != strconv.Itoa(outsideChanged) || r[3] != want {
			t.Errorf("follower %s: %s of %s rows stale, want %s", r[1], r[3], r[2], want)
		}
	}
}

// TestAttackAlternates: with Rounds, the paths of a scenario take turns,
// the order reversed every other round, each turn a slice of Duration.
func TestAttackAlternates(t *testing.T) {
	shop, hs := newTestShop(t, 1000, 100)
	var phases []string
	rows, err := attack(context.Background(), hs.URL, attackOptions{Duration: 600 * time.Millisecond, Rounds: 3, Workers: 4,
		Burst: 10, HotProduct: "1", Products: 1000, Scenarios: []string{"zipf"}, Paths: []string{"naive", "guard"},
		OnPhase: func(p string) {
			if p != "" {
				phases = append(phases, p)
			}
			shop.live.setPhase(p)
		}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"zipf naive", "zipf guard", "zipf guard", "zipf naive", "zipf naive", "zipf guard"}
	if !slices.Equal(phases, want) {
		t.Fatalf("runs %q, want %q", phases, want)
	}
	for _, r := range rows {
		var sum int64
		for _, n := range r.Slices {
			sum += n
		}
		if len(r.Slices) != 3 || sum != r.Requests || r.Requests == 0 {
			t.Errorf("%s: rounds %v, requests %d", r.Path, r.Slices, r.Requests)
		}
	}
}

// TestDemoPaths runs one scenario on two of its paths (-only, -paths) and
// checks that the table has those rows and no others.
func TestDemoPaths(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("TMPDIR", t.TempDir())
	var out bytes.Buffer
	err := runServe(context.Background(), true, []string{"-exit", "-duration", "300ms", "-only", "zipf", "-paths", "guard, refresh"}, &out, io.Discard)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^\| (\w+) \| (\w+) \| (\d+) \|`).FindAllStringSubmatch(out.String(), -1) {
		if n, _ := strconv.Atoi(m[3]); n == 0 {
			t.Errorf("row %s/%s served no request", m[1], m[2])
		}
		got = append(got, m[1]+"/"+m[2])
	}
	if want := []string{"zipf/guard", "zipf/refresh"}; !slices.Equal(got, want) {
		t.Fatalf("rows %v, want %v:\n%s", got, want, out.String())
	}
	for _, bad := range [][]string{{"-paths", "guard,fast"}, {"-only", "zipf,flood"}} {
		err := runServe(context.Background(), true, append([]string{"-exit"}, bad...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("%v: err %v, want an unknown-name error", bad, err)
		}
	}
}

// waitReady waits until g's filter is ready (rebuilt after a loss).
func waitReady(t *testing.T, g *guard.Guard) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if info, err := g.Info(context.Background()); err == nil && info.Ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the filter was not rebuilt within 30 s")
		}
		time.Sleep(10 * time.Millisecond) // polling Redis's state, which the Guard's rebuild sets
	}
}
