package faults_test

// A Redis Cluster master killed while three OS processes stampede cold keys,
// and again while a Rebuild runs. The processes are this test binary run
// again in a child role; their source of truth is a function of the ID
// (pN holds N), so it survives what happens to Redis.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

const childEnv = "FAULTS_CHILD"

// childReport is what a child prints.
type childReport struct {
	Gets, Wrong, FalseNotFound, Fails, Loads int64
	LoadThroughs                             int64 // of Loads, those made without Redis (the outage policy)
	MaxLatency                               time.Duration
	LastFail                                 int64 // unix nanos of the last failed Get
	LastThrough                              int64 // unix nanos of the last sample that saw a load-through
	Err                                      string
}

func clusterClient(addrs []string) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, DialerRetries: 1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, MaxRedirects: 2})
}

// child runs a role and returns the exit code.
func child(role string) int {
	if role != "cluster-stampede" {
		fmt.Fprintln(os.Stderr, "unknown role", role)
		return 2
	}
	var rep childReport
	defer func() { _ = json.NewEncoder(os.Stdout).Encode(rep) }()
	rdb := clusterClient(strings.Split(os.Getenv("ADDRS"), ","))
	defer rdb.Close()
	g, err := guard.New(context.Background(), rdb, "product", &guard.Options{
		Outage: &guard.OutageOptions{MaxLoads: maxLoads},
		Filter: guard.FilterOptions{ExpectedItems: 200_000},
		Tuning: guard.Tuning{LockTTL: time.Second},
	})
	if err != nil {
		rep.Err = err.Error()
		return 0
	}
	defer g.Close()
	var loads atomic.Int64
	load := func(ctx context.Context, id string) (int, error) {
		loads.Add(1)
		time.Sleep(loadTime)
		return loadNumbered(ctx, id)
	}
	until, _ := strconv.ParseInt(os.Getenv("UNTIL"), 10, 64)
	var mu sync.Mutex // guards rep
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // samples when the Guard last loaded through
		defer wg.Done()
		var last uint64
		for time.Now().UnixNano() < until {
			time.Sleep(20 * time.Millisecond)
			if n := g.Stats().LoadThroughs; n != last {
				last = n
				mu.Lock()
				rep.LastThrough = time.Now().UnixNano()
				mu.Unlock()
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().UnixNano() < until {
				// Every process takes the same cold key in the same 50ms
				// tick: a stampede across processes, again and again.
				tick := time.Now().UnixNano() / int64(50*time.Millisecond)
				id, want := "p"+strconv.FormatInt(tick%100_000, 10), int(tick%100_000)
				if w%4 == 3 {
					id, want = "u"+strconv.FormatInt(tick, 10), -1
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				v, err := guard.Get(ctx, g, id, load)
				took := time.Since(start)
				cancel()
				mu.Lock()
				rep.Gets++
				rep.MaxLatency = max(rep.MaxLatency, took)
				switch {
				case err == nil && (want < 0 || v != want):
					rep.Wrong++
				case errors.Is(err, guard.ErrNotFound) && want >= 0:
					rep.FalseNotFound++
				case err != nil && !errors.Is(err, guard.ErrNotFound):
					rep.Fails++
					rep.LastFail = time.Now().UnixNano()
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	rep.Loads, rep.LoadThroughs = loads.Load(), int64(g.Stats().LoadThroughs)
	return 0
}

// startCluster starts a 3-master, 3-replica Redis Cluster of the test's
// own, stopped when the test ends.
func startCluster(t *testing.T) *redisserver.Cluster {
	t.Helper()
	cl, err := redisserver.StartCluster(context.Background(), 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	return cl
}

func TestClusterMasterKilled(t *testing.T) {
	ctx := context.Background()
	cl := startCluster(t)
	rdb := clusterClient(cl.Addrs())
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "product", &guard.Options{Filter: guard.FilterOptions{ExpectedItems: 200_000}, Tuning: guard.Tuning{LockTTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, numbered(100_000), nil); err != nil {
		t.Fatal(err)
	}

	phases := []struct {
		name  string
		fault func(kill func())
	}{
		{"cluster: master SIGKILLed during a 3-process stampede", func(kill func()) { kill() }},
		{"cluster: master SIGKILLed during a Rebuild", func(kill func()) {
			// A Rebuild right after the first failover may fail before its
			// first progress (the client's slot map lags it): it is asked
			// again until the kill ran during one.
			var once sync.Once
			killed := false
			for deadline := time.Now().Add(15 * time.Second); !killed && time.Now().Before(deadline); {
				_, err := g.Rebuild(ctx, numbered(100_000), &bloom.RebuildOptions{Progress: func(bloom.RebuildProgress) {
					once.Do(func() { kill(); killed = true })
				}})
				t.Logf("the Rebuild during the kill: %v", err)
			}
		}},
	}
	for _, ph := range phases {
		masters, err := cl.Masters(ctx)
		if err != nil || len(masters) == 0 {
			t.Fatalf("masters: %v", err)
		}
		const run = 10 * time.Second
		until := time.Now().Add(run)
		var children []*exec.Cmd
		var outs []*bytes.Buffer
		for range 3 {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=cluster-stampede", "ADDRS="+strings.Join(cl.Addrs(), ","),
				"UNTIL="+strconv.FormatInt(until.UnixNano(), 10))
			out := &bytes.Buffer{}
			cmd.Stdout, cmd.Stderr = out, os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			children, outs = append(children, cmd), append(outs, out)
		}
		time.Sleep(2 * time.Second)
		var killed time.Time
		ph.fault(func() {
			killed = time.Now()
			if err := masters[0].Kill(); err != nil {
				t.Error(err)
			}
		})
		if killed.IsZero() {
			t.Fatalf("%s: the master was never killed", ph.name)
		}
		var total childReport
		for i, cmd := range children {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("child: %v", err)
			}
			var rep childReport
			if err := json.Unmarshal(outs[i].Bytes(), &rep); err != nil || rep.Err != "" {
				t.Fatalf("child report %q: %v %s", outs[i].String(), err, rep.Err)
			}
			total.Gets += rep.Gets
			total.Wrong += rep.Wrong
			total.FalseNotFound += rep.FalseNotFound
			total.Fails += rep.Fails
			total.Loads += rep.Loads
			total.LoadThroughs += rep.LoadThroughs
			total.MaxLatency = max(total.MaxLatency, rep.MaxLatency)
			total.LastFail = max(total.LastFail, rep.LastFail)
			total.LastThrough = max(total.LastThrough, rep.LastThrough)
		}
		// Recovered: the last Get that failed, or that had to load
		// through, after the kill.
		recovered := time.Duration(max(total.LastFail, total.LastThrough, killed.UnixNano()) - killed.UnixNano())
		keys := int(run / (50 * time.Millisecond))
		record(row{Scenario: ph.name, Gets: total.Gets, Wrong: total.Wrong, FalseNotFound: total.FalseNotFound, Fails: total.Fails,
			MaxLatency: total.MaxLatency, Recovery: recovered})
		t.Logf("%s: %+v; %d loads through Redis for about %d cold keys in 3 processes, %d loaded through during the failover",
			ph.name, total, total.Loads-total.LoadThroughs, keys, total.LoadThroughs)
		if total.Wrong != 0 || total.FalseNotFound != 0 {
			t.Fatalf("%s: %d wrong values, %d false not-found", ph.name, total.Wrong, total.FalseNotFound)
		}
		if err := cl.WaitHealthy(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// After both failovers, a Rebuild works and the filter answers. Its
	// first round trip may go to a dead master's address: the client's slot
	// map lags the failover until a failure reloads it (Guard.reloadSlots,
	// at most once a second), so a Rebuild is asked again, as a caller
	// would on ErrUnavailable. Which master a shard lives on follows its
	// generation, which the clock picks.
	var rebuildErr error
	for deadline := time.Now().Add(15 * time.Second); ; {
		_, rebuildErr = g.Rebuild(ctx, numbered(100_000), nil)
		if rebuildErr == nil || !errors.Is(rebuildErr, guard.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // polling the client's view of the slots, which no event reports
	}
	if rebuildErr != nil {
		t.Fatalf("Rebuild after the failovers: %v", rebuildErr)
	}
	if _, err := guard.Get(ctx, g, "unknown", func(context.Context, string) (int, error) { return 0, guard.ErrNotFound }); !errors.Is(err, guard.ErrNotFound) {
		t.Fatal(err)
	}
}

// TestClusterFailover: one Guard on a 3-master, 3-replica Redis Cluster of
// its own keeps serving when a master is SIGKILLed: after the replica takes
// over, the same client answers every known ID again (never a false
// ErrNotFound, even during the failover) and Info describes the filter.
func TestClusterFailover(t *testing.T) {
	ctx := context.Background()
	cl := startCluster(t)
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
	const n = 1000
	if _, err := g.Rebuild(ctx, numbered(n), nil); err != nil {
		t.Fatal(err)
	}
	readAll := func() int { return readNumbered(t, g, n) }
	if errs := readAll(); errs != 0 {
		t.Fatalf("%d errors on a healthy cluster", errs)
	}
	if _, err := guard.Get(ctx, g, "unknown", loadNumbered); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}

	masters, err := cl.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters: %d, %v", len(masters), err)
	}
	// The master to kill must have handed its writes (the filter's shard,
	// if it holds it) to its replica: a replica that is still catching up
	// takes over without them, and the filter then reads as lost (that
	// case is guard's heal tests'). Seen: a replica at offset 0 seconds
	// after the cluster reported healthy.
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
	during := readNumbered(t, g, 30)
	if err := cl.WaitHealthy(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster healthy again %v after the kill", time.Since(killed).Round(time.Millisecond))
	// The same client, no restart: go-redis follows the new slot owners.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		after := readAll()
		if after == 0 {
			break
		}
		t.Logf("%d errors at %v", after, time.Since(killed).Round(time.Millisecond))
		if time.Now().After(deadline) {
			t.Fatal("reads without errors after the failover: not within 5s")
		}
	}
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

// numbered yields p0..p(n-1).
func numbered(n int) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for i := range n {
			if !yield("p"+strconv.Itoa(i), nil) {
				return
			}
		}
	}
}

// loadNumbered is a source of truth that needs no state: pN holds N, and
// no other ID exists.
func loadNumbered(_ context.Context, id string) (int, error) {
	if v, err := strconv.Atoi(strings.TrimPrefix(id, "p")); err == nil && strings.HasPrefix(id, "p") {
		return v, nil
	}
	return 0, fmt.Errorf("%s: %w", id, guard.ErrNotFound)
}

// readNumbered Gets p0..p(n-1) and counts Redis errors; a false
// ErrNotFound or a wrong value fails the test.
func readNumbered(t *testing.T, g *guard.Guard, n int) (errs int) {
	t.Helper()
	for i := range n {
		id := "p" + strconv.Itoa(i)
		v, err := guard.Get(context.Background(), g, id, loadNumbered)
		switch {
		case errors.Is(err, guard.ErrNotFound):
			t.Fatalf("%s: false ErrNotFound", id)
		case err != nil:
			if errs == 0 {
				t.Logf("%s: %v", id, err)
			}
			errs++
		case v != i:
			t.Fatalf("%s: got %d", id, v)
		}
	}
	return errs
}
