package guard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// TestClusterFailover: a Guard on a real 3-master, 3-replica Redis Cluster
// keeps serving when a master is SIGKILLed: after the replica takes over, the
// same client answers every known ID again (never a false ErrNotFound, even
// during the failover) and Info describes the filter.
// readSome reads n known IDs and counts Redis errors; a false ErrNotFound
// fails the test.
func readSome(t *testing.T, g *guard.Guard, d *db, n int) (errs int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		p, err := guard.Get(context.Background(), g, id, d.load)
		switch {
		case errors.Is(err, guard.ErrNotFound):
			t.Fatalf("%s: false ErrNotFound", id)
		case err != nil:
			if errs == 0 {
				t.Logf("%s: %v", id, err)
			}
			errs++
		case p.ID != id:
			t.Fatalf("%s: got %+v", id, p)
		}
	}
	return errs
}

// ownCluster starts a 3-master cluster of the test's own, replicas per
// master, stopped when it ends, and runs t in parallel with the other slow
// tests (not in the cluster pass: standaloneOnly).
func ownCluster(t *testing.T, replicas int) *redisserver.Cluster {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	standaloneOnly(t)
	cl, err := redisserver.StartCluster(context.Background(), 3, replicas)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	return cl
}

func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own and fails a master over: make test")
	}
	ctx := context.Background()
	cl := ownCluster(t, 1)
	// Short dial and read timeouts: during the failover, calls to the dead
	// master fail fast instead of stalling the test.
	opts := cl.Options()
	opts.DialTimeout, opts.ReadTimeout, opts.MaxRedirects = 200*time.Millisecond, 500*time.Millisecond, 1
	rdb := redis.NewClusterClient(opts)
	defer rdb.Close()
	// Several shards, so the filter spreads over the masters too.
	g, err := guard.New(
		ctx,
		rdb,
		"product",
		&guard.Options{Filter: guard.FilterOptions{ExpectedItems: 200_000}, Tuning: guard.Tuning{LockTTL: time.Second}},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	d := newDB(1000)
	if _, err := g.Rebuild(ctx, ids("p", 1000), nil); err != nil {
		t.Fatal(err)
	}
	readAll := func() int { return readSome(t, g, d, 1000) }
	if errs := readAll(); errs != 0 {
		t.Fatalf("%d errors on a healthy cluster", errs)
	}
	if _, err := guard.Get(ctx, g, "unknown", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}

	masters, err := cl.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters: %d, %v", len(masters), err)
	}
	// The master to kill must have handed its writes (the filter's shard,
	// if it holds it) to its replica: a replica that is still catching up
	// takes over without them, and the filter then reads as lost (that
	// case is the heal tests'). Seen: a replica at offset 0 seconds after
	// the cluster reported healthy.
	mc := redis.NewClient(&redis.Options{Addr: masters[0].Addr})
	acked, err := mc.Do(ctx, "WAIT", 1, 20_000).Int()
	_ = mc.Close()
	if err != nil || acked < 1 {
		t.Fatalf("master %s: WAIT for its replica: %d replicas acknowledged, %v", masters[0].Addr, acked, err)
	}
	if err := masters[0].Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	during := readSome(t, g, d, 30)
	if err := cl.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster healthy again %v after the kill", time.Since(killed).Round(time.Millisecond))
	// The same client, no restart: go-redis follows the new slot owners.
	eventually(t, 5*time.Second, "reads without errors after the failover", func() bool {
		after := readAll()
		if after != 0 {
			t.Logf("%d errors at %v", after, time.Since(killed).Round(time.Millisecond))
		}
		return after == 0
	})
	in, err := g.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf(
		"master %s killed; %d Redis errors (no false not-found) during the failover; serving again "+
			"%v after the kill; Info: generation %d, ready %v, %d shards, %d bits set, estimated FP "+
			"%.4f%%, stats %+v",
		masters[0].Addr,
		during,
		time.Since(killed).Round(time.Millisecond),
		in.Generation,
		in.Ready,
		in.Config.Shards,
		in.BitsSet,
		in.EstimatedFPRate*100,
		g.Stats(),
	)
	if !in.Ready || in.BitsSet == 0 {
		t.Fatalf("Info %+v", in)
	}
}

// TestIdleGuardRepairsLostWritesOnACluster: a master of a 3-master
// cluster is SIGKILLed and restarts from a dump older than the writer's
// Invalidates; the writer, idle, replays those of that master's slots
// (their old entries deleted) with no Get.
func TestIdleGuardRepairsLostWritesOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and restarts a master")
	}
	ctx := context.Background()
	cl := ownCluster(t, 0)
	rdb := redis.NewClusterClient(cl.Options())
	defer rdb.Close()
	const n = 30
	d := newDB(n)
	g := openRebuilt(t, rdb, guard.Options{}, 1000, n)
	names := make([]string, n)
	for i := range names {
		names[i] = pid(i)
	}
	cache(t, g, d, names...)
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Save(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	for _, id := range names {
		d.set(product{ID: id, Name: "changed " + id, Price: 1000})
		if err := g.Invalidate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	keys := keyspace.ForGuard("cg", "product", 128) // the default KeyPrefix
	p0, _ := keys.Value("p0")
	master, err := rdb.MasterForKey(ctx, p0)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(cl.Nodes, func(s *redisserver.Server) bool { return s.Addr == master.Options().Addr })
	guard.SetWatch(g, false) // until the old entries are seen back
	crash(t, cl.Nodes[i])
	back := time.Now()
	// old counts the entries Redis holds, and the keys it did not answer for.
	old := func() (held, failed int) {
		for _, id := range names {
			k, _ := keys.Value(id)
			switch e, err := rdb.Exists(ctx, k).Result(); {
			case err != nil:
				failed++
			case e != 0:
				held++
			}
		}
		return held, failed
	}
	eventually(t, 10*time.Second, "the restarted master answering", func() bool { h, f := old(); return h > 0 && f == 0 })
	if held, _ := old(); held == n {
		t.Fatalf("all %d old entries back: the other masters lost the Invalidates too", n)
	}
	answered := time.Now()
	guard.SetWatch(g, true)
	eventually(t, 20*time.Second, "the old entries deleted without a Get", func() bool { h, f := old(); return h == 0 && f == 0 })
	t.Logf("repaired %v after the master restarted, %v after it answered",
		time.Since(back).Round(time.Millisecond), time.Since(answered).Round(time.Millisecond))
	if st := g.Stats(); st.WritesLost == 0 || st.WritesLost == n {
		t.Fatalf("WritesLost %d: want the Invalidates of the restarted master's slots alone", st.WritesLost)
	}
}
