package guard_test

// The stampede with short-lived processes: each child exits (os.Exit,
// no Close) as soon as its Gets return, as a CLI, a cron task or a
// serverless handler frozen after its answer does. An answer that went
// out before its write and release would leave the lock behind.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func init() {
	childRoles["stampede-exit"] = childStampedeExit
	childRoles["spin"] = childSpin
}

// childStampedeExit: GOROUTINES callers of one cold key, started together
// with the other processes; prints what they got and exits at once.
func childStampedeExit(rdb redis.UniversalClient) int {
	ctx := context.Background()
	prefix := os.Getenv("PREFIX")
	procs, _ := strconv.ParseInt(os.Getenv("PROCS"), 10, 64)
	goroutines, _ := strconv.Atoi(os.Getenv("GOROUTINES"))
	g := childGuard(rdb) // never closed: the process just ends
	load := func(ctx context.Context, id string) (string, error) {
		rdb.Incr(ctx, prefix+":calls:"+id)
		time.Sleep(50 * time.Millisecond) // a slow query (the test's subject: no state to wait on)
		return "value of " + id, nil
	}
	barrier(rdb, prefix+":barrier", procs)
	res := stampedeResult{Values: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			start := time.Now()
			v, err := guard.Get(ctx, g, "p0", load)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors = append(res.Errors, err.Error())
				return
			}
			res.Values[v]++
			res.Latency = append(res.Latency, took)
		})
	}
	wg.Wait()
	res.Stats = g.Stats()
	if printJSON(res) != 0 {
		os.Exit(2)
	}
	os.Exit(0) // before anything the Guard still had to do: that is the point
	return 0
}

// childSpin keeps a core busy for at most a minute (the parent kills it
// sooner).
func childSpin(redis.UniversalClient) int {
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		for i := 0; i < 1_000_000; i++ {
			runtime.KeepAlive(i)
		}
	}
	return 0
}

// TestStampedeOfExitingProcesses: four fresh processes × 100 callers on one
// cold key of a fresh Redis (data and scripts flushed), each process
// exiting as soon as its Gets return; quiet, then with two processes
// spinning on the two cores. Every round: one load under the lock (plus a
// load-through per child whose Redis round trips timed out), every caller
// the value, no error, no caller waiting out a lock's lease, and no lock left
// behind once every process has exited.
func TestStampedeOfExitingProcesses(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	if redistest.ClusterMode() {
		t.Skip("runs against a private standalone server; the cluster run covers TestStampedeAcrossProcesses")
	}
	const procs, goroutines, rounds = 4, 100, 5
	const lockTTL = 5 * time.Second
	srv, rdb := redistest.Private(t)
	ctx := context.Background()
	for _, busy := range []bool{false, true} {
		if busy {
			for range 2 {
				spin := redistest.SpawnOn(t, srv, "spin")
				t.Cleanup(func() { _ = spin.Cmd.Process.Kill() })
			}
		}
		var all []time.Duration
		throughs := 0
		for r := range rounds {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("exit%d", r)
			env := []string{"PREFIX=" + prefix, fmt.Sprintf("PROCS=%d", procs),
				fmt.Sprintf("GOROUTINES=%d", goroutines), "LOCK_TTL=" + lockTTL.String()}
			var children []*redistest.Child
			for range procs {
				children = append(children, redistest.SpawnOn(t, srv, "stampede-exit", env...))
			}
			var stats []guard.Stats // each child's, for a failure's message
			for i, ch := range children {
				ch.Wait(t, false)
				var res stampedeResult
				if err := json.Unmarshal(ch.Stdout.Bytes(), &res); err != nil {
					t.Fatalf("busy=%v round %d child %d: %v: %q", busy, r, i, err, ch.Stdout.String())
				}
				if len(res.Errors) > 0 || res.Values["value of p0"] != goroutines {
					t.Fatalf("busy=%v round %d child %d: values %v, %d errors %q", busy, r, i, res.Values, len(res.Errors), res.Errors[:min(len(res.Errors), 1)])
				}
				all = append(all, res.Latency...)
				stats = append(stats, res.Stats)
			}
			// One load under the lock. A child whose round trips ran past
			// RedisTimeout (a starved machine) loads through on its own, as
			// the outage policy says: counted apart, and only after Redis errors.
			through := 0
			for i, st := range stats {
				through += int(st.LoadThroughs)
				if st.LoadThroughs > 0 && st.RedisErrors == 0 {
					t.Errorf("busy=%v round %d child %d: loaded through with no Redis error: %+v", busy, r, i, st)
				}
			}
			if n, _ := rdb.Get(ctx, prefix+":calls:p0").Int(); n != 1+through {
				t.Errorf("busy=%v round %d: %d loads of p0, want 1 + %d load-throughs; the children's stats: %+v", busy, r, n, through, stats)
			}
			throughs += through
			locks, err := rdb.Keys(ctx, prefix+":*:lock").Result()
			if err != nil || len(locks) > 0 {
				t.Errorf("busy=%v round %d: locks left behind after every process exited: %v (%v)", busy, r, locks, err)
			}
			values, err := rdb.Keys(ctx, prefix+":product:{*}").Result()
			if err != nil || len(values) != 1 {
				t.Errorf("busy=%v round %d: value keys %v (%v), want the one of p0", busy, r, values, err)
			}
		}
		slices.Sort(all)
		if slowest := all[len(all)-1]; slowest >= lockTTL {
			t.Errorf("busy=%v: a caller waited %v, a lock's lease: a holder's lock was stranded", busy, slowest)
		}
		t.Logf("busy=%v: %d callers over %d rounds: p50 %v, p99 %v, max %v; %d load-throughs", busy, len(all), rounds,
			all[len(all)/2], all[len(all)*99/100], all[len(all)-1], throughs)
	}
}
