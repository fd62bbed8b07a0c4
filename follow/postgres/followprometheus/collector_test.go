package followprometheus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/follow/postgres/followprometheus"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestCollector: a follower whose inspector checks every ID 200 ms after its
// write applies one UPDATE of 10 rows; a registry then gathers its counts,
// the inspector's by table and delay, and the collector passes the linter.
// The first start counts a rollback: Redis held no position of the follower.
func TestCollector(t *testing.T) {
	ctx := context.Background()
	srv, err := pgserver.Start("wal_level=logical")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	url := srv.URL("postgres")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE TABLE products (id text PRIMARY KEY, v int)")
	exec("INSERT INTO products SELECT 'p' || i, 0 FROM generate_series(1, 10) i")
	opts := &pgfollow.Options{Inspect: pgfollow.Inspect{Rate: 1, Delays: []time.Duration{200 * time.Millisecond}}}
	if err := pgfollow.Setup(ctx, url, opts, "products"); err != nil {
		t.Fatal(err)
	}
	c := redistest.Connect(t)
	g, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	f, err := pgfollow.New(url, []pgfollow.Table{{Name: "products", Guard: g}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(run) }()
	defer func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v, want context.Canceled", err)
		}
	}()
	exec("UPDATE products SET v = 1")
	redistest.Eventually(t, 30*time.Second, "the inspector's 10 checks", func() bool {
		in := f.Stats().Inspections
		return len(in) == 1 && in[0].Checked == 10
	})

	col := followprometheus.New(f)
	reg := prometheus.NewPedanticRegistry() // also checks descriptors against what is collected
	reg.MustRegister(col)
	want := `
# HELP cacheguard_pgfollow_changes_total Row changes applied.
# TYPE cacheguard_pgfollow_changes_total counter
cacheguard_pgfollow_changes_total 10
# HELP cacheguard_pgfollow_following 1 while the follower consumes the slot.
# TYPE cacheguard_pgfollow_following gauge
cacheguard_pgfollow_following 1
# HELP cacheguard_pgfollow_inconsistent_total Inspected IDs found inconsistent: an entry or marker older than the write, or an inserted ID the filter lacks.
# TYPE cacheguard_pgfollow_inconsistent_total counter
cacheguard_pgfollow_inconsistent_total{delay="200ms",table="public.products"} 0
# HELP cacheguard_pgfollow_inspect_repaired_total Inconsistencies the inspector repaired (Inspect.Repair).
# TYPE cacheguard_pgfollow_inspect_repaired_total counter
cacheguard_pgfollow_inspect_repaired_total{delay="200ms",table="public.products"} 0
# HELP cacheguard_pgfollow_inspected_total IDs written that the inspector read back, by table and delay after the write.
# TYPE cacheguard_pgfollow_inspected_total counter
cacheguard_pgfollow_inspected_total{delay="200ms",table="public.products"} 10
# HELP cacheguard_pgfollow_retries_total Batches tried again after Redis failed.
# TYPE cacheguard_pgfollow_retries_total counter
cacheguard_pgfollow_retries_total 0
# HELP cacheguard_pgfollow_rollbacks_total Times a Guard's Redis was found behind the slot (its writes repaired).
# TYPE cacheguard_pgfollow_rollbacks_total counter
cacheguard_pgfollow_rollbacks_total 1
# HELP cacheguard_pgfollow_standby 1 while another follower consumes the slot.
# TYPE cacheguard_pgfollow_standby gauge
cacheguard_pgfollow_standby 0
`
	// The lag moves with the server's WAL: its two gauges are there, by name.
	lag := []string{"cacheguard_pgfollow_lag_bytes", "cacheguard_pgfollow_lag_seconds"}
	if n, err := testutil.GatherAndCount(reg, lag...); err != nil || n != 2 {
		t.Fatalf("lag gauges: %d, %v", n, err)
	}
	var names []string
	for _, l := range strings.Split(want, "\n") {
		if name, ok := strings.CutPrefix(l, "# TYPE "); ok {
			names = append(names, strings.Fields(name)[0])
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}
