package guard_test

// Cross-process tests: the test binary runs again as child processes
// (redistest.Spawn), each with its own Guard on the parent's redis-server.
// The source of truth and the loader-call counters live in Redis, so every
// process sees the same ones.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

var childRoles = map[string]func(redis.UniversalClient) int{
	"stampede":      childStampede,
	"crash-holder":  childCrashHolder,
	"crash-waiter":  childCrashWaiter,
	"stale-readers": childStale,
	"switch":        childSwitch,
}

// childGuard opens the parent's Guard: same prefix, name and sizing.
func childGuard(rdb redis.UniversalClient) *guard.Guard {
	lockTTL, _ := time.ParseDuration(os.Getenv("LOCK_TTL"))
	g, err := guard.New(context.Background(), rdb, "product", &guard.Options{
		KeyPrefix: os.Getenv("PREFIX"),
		Filter:    guard.FilterOptions{ExpectedItems: 10_000},
		Tuning:    guard.Tuning{LockTTL: lockTTL},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return g
}

// barrier waits until n processes have reached it: the last to arrive
// pushes a token for each, and each waits for one (BLPOP, no polling).
func barrier(rdb redis.UniversalClient, name string, n int64) {
	ctx := context.Background()
	if rdb.Incr(ctx, name).Val() == n {
		tokens := make([]any, n)
		for i := range tokens {
			tokens[i] = "go"
		}
		rdb.RPush(ctx, name+":go", tokens...)
	}
	rdb.BLPop(ctx, 0, name+":go")
}

type stampedeResult struct {
	Values  map[string]int // value → callers that got it
	Errors  []string
	Latency []time.Duration
	Stats   guard.Stats
}

// childStampede: ROUNDS keys in turn, GOROUTINES callers each, all processes
// starting each key together; the loader counts its calls in Redis and takes
// 50 ms.
func childStampede(rdb redis.UniversalClient) int {
	ctx := context.Background()
	prefix := os.Getenv("PREFIX")
	procs, _ := strconv.ParseInt(os.Getenv("PROCS"), 10, 64)
	rounds, _ := strconv.Atoi(os.Getenv("ROUNDS"))
	goroutines, _ := strconv.Atoi(os.Getenv("GOROUTINES"))
	g := childGuard(rdb)
	defer g.Close()
	load := func(ctx context.Context, id string) (string, error) {
		rdb.Incr(ctx, prefix+":calls:"+id)
		time.Sleep(50 * time.Millisecond) // a slow query (the test's subject: no state to wait on)
		return "value of " + id, nil
	}
	res := stampedeResult{Values: map[string]int{}}
	var mu sync.Mutex
	for r := range rounds {
		id := fmt.Sprintf("p%d", r)
		barrier(rdb, fmt.Sprintf("%s:barrier:%d", prefix, r), procs)
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				v, err := guard.Get(ctx, g, id, load)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					res.Errors = append(res.Errors, err.Error())
					return
				}
				if v != "value of "+id {
					res.Errors = append(res.Errors, "wrong value "+v)
				}
				res.Values[v]++
				res.Latency = append(res.Latency, took)
			}()
		}
		wg.Wait()
	}
	res.Stats = g.Stats()
	return printJSON(res)
}

func printJSON(v any) int {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestStampedeAcrossProcesses: 4 processes × 100 goroutines on one cold key
// at the same instant, over 20 keys: exactly one loader call per key.
func TestStampedeAcrossProcesses(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	const procs, rounds, goroutines = 4, 20, 100
	c, _, _ := setup(t, rounds, nil)
	env := []string{"PREFIX=" + c.Prefix, fmt.Sprintf("PROCS=%d", procs),
		fmt.Sprintf("ROUNDS=%d", rounds), fmt.Sprintf("GOROUTINES=%d", goroutines)}
	var children []*redistest.Child
	for range procs {
		children = append(children, redistest.Spawn(t, "stampede", env...))
	}
	var all []time.Duration
	var waits, wakeups uint64
	for i, ch := range children {
		ch.Wait(t, false)
		var r stampedeResult
		if err := json.Unmarshal(ch.Stdout.Bytes(), &r); err != nil {
			t.Fatalf("child %d: %v: %q", i, err, ch.Stdout.String())
		}
		if len(r.Errors) > 0 {
			t.Fatalf("child %d: %d errors, first: %s", i, len(r.Errors), r.Errors[0])
		}
		got := 0
		for _, n := range r.Values {
			got += n
		}
		if got != rounds*goroutines {
			t.Fatalf("child %d: %d values, want %d", i, got, rounds*goroutines)
		}
		all = append(all, r.Latency...)
		waits += r.Stats.LockWaits
		wakeups += r.Stats.Wakeups
	}
	ctx := context.Background()
	total := 0
	for r := range rounds {
		n, _ := c.Get(ctx, fmt.Sprintf("%s:calls:p%d", c.Prefix, r)).Int()
		if n != 1 {
			t.Errorf("key p%d: %d loader calls, want 1", r, n)
		}
		total += n
	}
	if total != rounds {
		t.Fatalf("%d loader calls for %d keys", total, rounds)
	}
	slices.Sort(all)
	p := func(q float64) time.Duration { return all[int(q*float64(len(all)-1))] - 50*time.Millisecond }
	t.Logf("%d callers in %d processes over %d keys: %d loader calls; lock waits %d, pub/sub wake-ups %d; "+
		"latency minus the 50ms load: p50 %v, p99 %v, max %v",
		len(all), procs, rounds, total, waits, wakeups, p(0.5), p(0.99), p(1))
}

// childCrashHolder takes the lock by loading with a loader that never ends.
func childCrashHolder(rdb redis.UniversalClient) int {
	ctx := context.Background()
	prefix := os.Getenv("PREFIX")
	g := childGuard(rdb)
	defer g.Close()
	_, err := guard.Get(ctx, g, "p1", func(ctx context.Context, id string) (string, error) {
		rdb.Incr(ctx, prefix+":calls")
		rdb.Set(ctx, prefix+":loading", "1", 0)
		select {} // killed before this ends
	})
	fmt.Fprintln(os.Stderr, "holder returned:", err)
	return 1
}

type crashResult struct {
	Values []string
	Errors []string
	AtNano []int64 // when each caller got its answer
}

// childCrashWaiter calls Get while the holder is loading.
func childCrashWaiter(rdb redis.UniversalClient) int {
	ctx := context.Background()
	prefix := os.Getenv("PREFIX")
	g := childGuard(rdb)
	defer g.Close()
	var res crashResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := guard.Get(ctx, g, "p1", func(ctx context.Context, id string) (string, error) {
				rdb.Incr(ctx, prefix+":calls")
				return "value of " + id, nil
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors = append(res.Errors, err.Error())
			}
			res.Values = append(res.Values, v)
			res.AtNano = append(res.AtNano, time.Now().UnixNano())
		}()
	}
	// One runs the flight, which waits on the holder's lock; the others join it.
	root := redistest.GoID()
	if !redistest.Poll(30*time.Second, func() bool { return joinedFlights(root) >= 19 }) {
		fmt.Fprintln(os.Stderr, "crash-waiter: 19 callers did not join the flight within 30 s")
		return 1
	}
	rdb.Incr(ctx, prefix+":waiting") // all 20 are in Get, waiting on the lock
	wg.Wait()
	return printJSON(res)
}

// TestHolderCrash: the process holding the lock is SIGKILLed mid-load; the
// others get the value about one lock TTL later, with one more loader call.
func TestHolderCrash(t *testing.T) {
	clusterToo(t)
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	const lockTTL = time.Second
	ctx := context.Background()
	c, _, _ := setup(t, 10, nil)
	env := []string{"PREFIX=" + c.Prefix, "LOCK_TTL=" + lockTTL.String()}
	holder := redistest.Spawn(t, "crash-holder", env...)
	waitFor(t, func() bool { return c.Exists(ctx, c.Prefix+":loading").Val() == 1 })
	waiters := []*redistest.Child{redistest.Spawn(t, "crash-waiter", env...), redistest.Spawn(t, "crash-waiter", env...)}
	waitFor(t, func() bool { n, _ := c.Get(ctx, c.Prefix+":waiting").Int(); return n == 2 })
	time.Sleep(3 * lockTTL / 2) // the watchdog keeps the live holder's lock: the time is the subject
	if n, _ := c.Get(ctx, c.Prefix+":calls").Int(); n != 1 {
		t.Fatalf("%d loader calls while the holder was alive, want 1", n)
	}
	if err := holder.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	holder.Wait(t, true)
	var latest time.Duration
	for i, w := range waiters {
		w.Wait(t, false)
		var r crashResult
		if err := json.Unmarshal(w.Stdout.Bytes(), &r); err != nil {
			t.Fatalf("waiter %d: %v: %q", i, err, w.Stdout.String())
		}
		if len(r.Errors) > 0 || len(r.Values) != 20 {
			t.Fatalf("waiter %d: %d values, errors %v", i, len(r.Values), r.Errors)
		}
		for j, v := range r.Values {
			if v != "value of p1" {
				t.Fatalf("waiter %d: got %q", i, v)
			}
			latest = max(latest, time.Unix(0, r.AtNano[j]).Sub(killed))
		}
	}
	if n, _ := c.Get(ctx, c.Prefix+":calls").Int(); n != 2 {
		t.Fatalf("%d loader calls, want 2 (the dead holder's and one more)", n)
	}
	t.Logf("holder SIGKILLed; all 40 waiters in 2 processes had the value %v later (lock TTL %v)", latest, lockTTL)
}

type staleResult struct {
	Rounds int
	Stats  guard.Stats
	Errors []string
}

// childStale runs ROUNDS rounds of the stale-set race on KEYS keys: a reader
// whose loader reads the source (v1) and stalls; a writer that, meanwhile,
// writes v2 to the source and calls Invalidate; then the reader resumes.
func childStale(rdb redis.UniversalClient) int {
	ctx := context.Background()
	prefix := os.Getenv("PREFIX")
	rounds, _ := strconv.Atoi(os.Getenv("ROUNDS"))
	keys, _ := strconv.Atoi(os.Getenv("KEYS"))
	g := childGuard(rdb)
	defer g.Close()
	res := staleResult{}
	for r := range rounds {
		id := fmt.Sprintf("p%d", r%keys)
		read := make(chan struct{}, 1)
		resume := make(chan struct{})
		load := func(ctx context.Context, id string) (int64, error) {
			v, err := rdb.Get(ctx, prefix+":db:"+id).Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return 0, err
			}
			select {
			case read <- struct{}{}:
			default:
			}
			select { // stall until the writer is done (or give up)
			case <-resume:
			case <-time.After(time.Second):
			}
			return v, nil
		}
		done := make(chan error, 1)
		go func() {
			_, err := guard.Get(ctx, g, id, load)
			done <- err
		}()
		select {
		case <-read: // our loader has read v1
		case <-time.After(50 * time.Millisecond): // a hit, or another process is loading id
		}
		if err := rdb.Incr(ctx, prefix+":db:"+id).Err(); err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		if err := g.Invalidate(ctx, id); err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		close(resume)
		if err := <-done; err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		res.Rounds++
	}
	res.Stats = g.Stats()
	return printJSON(res)
}

// TestStaleSetRace: 1,000 rounds of the stale-set race over 8 keys and 4
// processes; afterwards every key's cache entry holds the source's final
// value or nothing, never an older one.
func TestStaleSetRace(t *testing.T) {
	clusterToo(t)
	if testing.Short() {
		t.Skip("many rounds across processes: make test")
	}
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	const procs, rounds, keys = 4, 250, 8
	ctx := context.Background()
	c, _, _ := setup(t, keys, nil)
	env := []string{"PREFIX=" + c.Prefix, fmt.Sprintf("ROUNDS=%d", rounds), fmt.Sprintf("KEYS=%d", keys)}
	var children []*redistest.Child
	for range procs {
		children = append(children, redistest.Spawn(t, "stale-readers", env...))
	}
	var refused uint64
	total := 0
	for i, ch := range children {
		ch.Wait(t, false)
		var r staleResult
		if err := json.Unmarshal(ch.Stdout.Bytes(), &r); err != nil {
			t.Fatalf("child %d: %v: %q", i, err, ch.Stdout.String())
		}
		if len(r.Errors) > 0 {
			t.Fatalf("child %d: %d errors, first: %s", i, len(r.Errors), r.Errors[0])
		}
		total += r.Rounds
		refused += r.Stats.StaleWrites
	}
	if total != procs*rounds {
		t.Fatalf("%d rounds ran, want %d", total, procs*rounds)
	}
	cached := 0
	for k := range keys {
		id := fmt.Sprintf("p%d", k)
		want, _ := c.Get(ctx, c.Prefix+":db:"+id).Int64()
		raw, err := c.HGet(ctx, c.Prefix+":product:{"+id+"}", "1:"+codec.Shape(codec.Msgpack, reflect.TypeFor[int64]())).Bytes()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var got int64
		if err := codec.Decode(codec.Msgpack, raw, &got); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if got != want {
			t.Fatalf("%s: cache holds %d, source has %d: a stale value was written", id, got, want)
		}
		cached++
	}
	t.Logf("%d rounds in %d processes over %d keys: %d stale writes refused (their lock deleted by a write); %d keys cached (all current), %d empty",
		total, procs, keys, refused, cached, keys-cached)
	if refused == 0 {
		t.Fatal("no write was ever refused: the race was not exercised")
	}
}
