package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	zbloom "github.com/zeromicro/go-zero/core/bloom"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/cputime"
)

// env is what every workload runs against.
type env struct {
	addr    string
	admin   *redis.Client // the runner's own client: INFO, PTTL, counters
	run     string        // unique per runner invocation
	hitTime time.Duration
}

func (e *env) build(ctx context.Context, name, workload string, ttl time.Duration, existing []string) (Contender, *counter, error) {
	ctr := &counter{}
	c, err := newContender(ctx, name, setup{addr: e.addr, prefix: e.prefix(name, workload), ttl: ttl, existing: existing, counter: ctr})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, ctr, nil
}

func (e *env) prefix(name, workload string) string {
	r := strings.NewReplacer("/", "_", "+", "_")
	return "b" + e.run + ":" + workload + ":" + r.Replace(name)
}

// serverCommands is Redis's total_commands_processed.
func (e *env) serverCommands(ctx context.Context) (int64, error) {
	info, err := e.admin.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no total_commands_processed in INFO")
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// parallel runs fn(0..n-1) on w goroutines and returns the first error.
func parallel(n, w int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

// reservoir is a uniform sample of a client's latencies (Algorithm R) in a
// buffer allocated before the run, so that recording a Get allocates
// nothing: a log that grew with the Gets made the runner's own garbage
// grow with a contender's speed (see hotKey). One per client goroutine.
type reservoir struct {
	rand   *rand.Rand
	seen   int64
	sample []time.Duration
}

func newReservoir(size int, seed uint64) *reservoir {
	return &reservoir{rand: rand.New(rand.NewPCG(seed, 99)), sample: make([]time.Duration, 0, size)}
}

// add records d: every latency seen so far is in the sample with the same
// probability.
func (rv *reservoir) add(d time.Duration) {
	switch {
	case len(rv.sample) < cap(rv.sample):
		rv.sample = append(rv.sample, d)
	default:
		if j := rv.rand.Int64N(rv.seen + 1); j < int64(len(rv.sample)) {
			rv.sample[j] = d
		}
	}
	rv.seen++
}

// sorted pools the samples of rvs, sorted for pct.
func sorted(rvs []*reservoir) []time.Duration {
	var all []time.Duration
	for _, rv := range rvs {
		all = append(all, rv.sample...)
	}
	slices.Sort(all)
	return all
}

// HitResult: workload 1.
type HitResult struct {
	Contender       string
	Ops             int64
	OpsPerSec       float64
	P50, P99        time.Duration
	TripsPerGet     float64 // client hook
	ServerCmdsPerOp float64 // INFO total_commands_processed
	AllocsPerOp     float64
	ClientCPU       time.Duration // this process's CPU per Get (the workers and the contender's client)
	ServerCPU       time.Duration // redis-server's CPU per Get
	VsRaw           float64       // the median of VsRawRuns
	VsRawRuns       []float64     // each run's ratio to raw's ops/s in the same round
}

// medianHit returns the median run by ops/s, with VsRaw the median of the
// runs' ratios and VsRawRuns all of them.
func medianHit(runs []HitResult) HitResult {
	byOps := slices.Clone(runs)
	slices.SortFunc(byOps, func(a, b HitResult) int { return cmp.Compare(a.OpsPerSec, b.OpsPerSec) })
	m := byOps[len(byOps)/2]
	ratios := make([]float64, len(runs))
	for i, r := range runs {
		ratios[i] = r.VsRaw
	}
	m.VsRawRuns = slices.Clone(ratios)
	slices.Sort(ratios)
	m.VsRaw = ratios[len(ratios)/2]
	return m
}

// hitPath: 10,000 warm keys, 64 goroutines for a fixed time.
func hitPath(ctx context.Context, e *env, name string, round int) (HitResult, error) {
	// A deadline, as a request's context has: rueidisaside puts a timeout of
	// the TTL (10 minutes here) on every Get whose context has none or a
	// later one, and that timer would cost it a tenth of its hit path.
	ctx, cancel := context.WithTimeout(ctx, e.hitTime+time.Minute)
	defer cancel()
	keys := ids("k", 10_000)
	load := func(ctx context.Context, id string) (Value, error) { return value(id), nil }
	c, ctr, err := e.build(ctx, name, "hit"+strconv.Itoa(round), 10*time.Minute, keys)
	if err != nil {
		return HitResult{}, err
	}
	defer c.Close()
	if err := parallel(len(keys), 32, func(i int) error { _, err := c.Get(ctx, keys[i], load); return err }); err != nil {
		return HitResult{}, fmt.Errorf("%s: warm-up: %w", name, err)
	}
	const workers = 64
	samples := make([]*reservoir, workers)
	for i := range samples {
		samples[i] = newReservoir(1<<17, uint64(i))
	}
	var ops, errs atomic.Int64
	var firstErr atomic.Value
	trips0 := ctr.RoundTrips()
	server0, err := e.serverCommands(ctx)
	if err != nil {
		return HitResult{}, err
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	scpu0, err := cputime.Redis(ctx, e.admin)
	if err != nil {
		return HitResult{}, err
	}
	ccpu0 := cputime.Process()
	stop := time.Now().Add(e.hitTime)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 0; ; n++ {
				if n%64 == 0 && time.Now().After(stop) {
					break
				}
				t := time.Now()
				_, err := c.Get(ctx, keys[r.IntN(len(keys))], load)
				d := time.Since(t)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				samples[w].add(d)
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	ccpu1 := cputime.Process()
	runtime.ReadMemStats(&m1)
	scpu1, err := cputime.Redis(ctx, e.admin)
	if err != nil {
		return HitResult{}, err
	}
	server1, err := e.serverCommands(ctx)
	if err != nil {
		return HitResult{}, err
	}
	if errs.Load() > 0 {
		return HitResult{}, fmt.Errorf("%s: %d errors on the hit path, first: %v", name, errs.Load(), firstErr.Load())
	}
	all := sorted(samples)
	n := float64(ops.Load())
	return HitResult{
		Contender: name, Ops: ops.Load(), OpsPerSec: n / elapsed.Seconds(),
		P50: pct(all, 0.5), P99: pct(all, 0.99),
		TripsPerGet:     float64(ctr.RoundTrips()-trips0) / n,
		ServerCmdsPerOp: float64(server1-server0-1) / n,
		AllocsPerOp:     float64(m1.Mallocs-m0.Mallocs) / n,
		ClientCPU:       time.Duration(float64(ccpu1-ccpu0) / n),
		ServerCPU:       time.Duration(float64(scpu1-scpu0) / n),
	}, nil
}

// PenetrationResult: workload 2.
type PenetrationResult struct {
	Contender   string
	Requests    int
	LoaderCalls int64
	OpsPerSec   float64
}

// penetration: 20,000 distinct nonexistent IDs against 10,000 existing ones.
func penetration(ctx context.Context, e *env, name string) (PenetrationResult, error) {
	existing := ids("k", 10_000)
	c, _, err := e.build(ctx, name, "pen", 10*time.Minute, existing)
	if err != nil {
		return PenetrationResult{}, err
	}
	defer c.Close()
	var calls atomic.Int64
	load := func(ctx context.Context, id string) (Value, error) {
		calls.Add(1)
		if strings.HasPrefix(id, "k") {
			return value(id), nil
		}
		return Value{}, errNotFound
	}
	missing := ids("missing-", 20_000)
	start := time.Now()
	err = parallel(len(missing), 64, func(i int) error {
		_, err := c.Get(ctx, missing[i], load)
		if !isNotFound(err) {
			return fmt.Errorf("%s: %s: want not found, got %v", name, missing[i], err)
		}
		return nil
	})
	if err != nil {
		return PenetrationResult{}, err
	}
	return PenetrationResult{Contender: name, Requests: len(missing), LoaderCalls: calls.Load(),
		OpsPerSec: float64(len(missing)) / time.Since(start).Seconds()}, nil
}

// StampedeResult: workload 3.
type StampedeResult struct {
	Contender   string
	Processes   int
	Callers     int
	Keys        int
	LoaderCalls int64
	P99         time.Duration
	MaxLatency  time.Duration
}

const (
	stampedeProcs   = 4
	stampedeWorkers = 100
	stampedeKeys    = 10
)

// stampede: 4 OS processes × 100 goroutines on one cold key at a time,
// loader 50 ms, 10 keys. The processes are this binary again ("child").
func stampede(ctx context.Context, e *env, name string) (StampedeResult, error) {
	prefix := e.prefix(name, "stampede")
	existing := ids("s", stampedeKeys)
	c, _, err := e.build(ctx, name, "stampede", 10*time.Minute, existing) // creates the filters
	if err != nil {
		return StampedeResult{}, err
	}
	c.Close()
	self, err := os.Executable()
	if err != nil {
		return StampedeResult{}, err
	}
	var cmds []*exec.Cmd
	outs := make([]strings.Builder, stampedeProcs)
	for i := range stampedeProcs {
		cmd := exec.CommandContext(ctx, self, "child", name, e.addr, prefix)
		cmd.Stdout, cmd.Stderr = &outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			return StampedeResult{}, err
		}
		cmds = append(cmds, cmd)
	}
	var lat []time.Duration
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return StampedeResult{}, fmt.Errorf("%s: child %d: %w", name, i, err)
		}
		var r childResult
		if err := json.Unmarshal([]byte(outs[i].String()), &r); err != nil {
			return StampedeResult{}, fmt.Errorf("%s: child %d: %w: %q", name, i, err, outs[i].String())
		}
		if r.Errors > 0 {
			return StampedeResult{}, fmt.Errorf("%s: child %d: %d errors, first: %s", name, i, r.Errors, r.FirstError)
		}
		lat = append(lat, r.Latency...)
	}
	var calls int64
	for _, id := range existing {
		n, err := e.admin.Get(ctx, prefix+":calls:"+id).Int64()
		if err != nil {
			return StampedeResult{}, fmt.Errorf("%s: loader counter: %w", name, err)
		}
		calls += n
	}
	slices.Sort(lat)
	if len(lat) != stampedeProcs*stampedeWorkers*stampedeKeys {
		return StampedeResult{}, fmt.Errorf("%s: %d answers, want %d", name, len(lat), stampedeProcs*stampedeWorkers*stampedeKeys)
	}
	return StampedeResult{Contender: name, Processes: stampedeProcs, Callers: len(lat), Keys: stampedeKeys,
		LoaderCalls: calls, P99: pct(lat, 0.99), MaxLatency: lat[len(lat)-1]}, nil
}

type childResult struct {
	Latency    []time.Duration
	Errors     int
	FirstError string
}

// runChild is one stampede process: for each key, wait until all processes
// are ready, then 100 goroutines Get it at once.
func runChild(ctx context.Context, name, addr, prefix string) error {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	c, err := newContender(ctx, name, setup{addr: addr, prefix: prefix, ttl: 10 * time.Minute, counter: &counter{},
		existing: ids("s", stampedeKeys), opened: true})
	if err != nil {
		return err
	}
	defer c.Close()
	load := func(ctx context.Context, id string) (Value, error) {
		admin.Incr(ctx, prefix+":calls:"+id)
		time.Sleep(50 * time.Millisecond)
		return value(id), nil
	}
	var res childResult
	var mu sync.Mutex
	for k := range stampedeKeys {
		id := "s" + strconv.Itoa(k)
		barrier := prefix + ":barrier:" + id
		admin.Incr(ctx, barrier)
		for {
			n, err := admin.Get(ctx, barrier).Int()
			if err != nil {
				return err
			}
			if n >= stampedeProcs {
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		var wg sync.WaitGroup
		for range stampedeWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				v, err := c.Get(ctx, id, load)
				d := time.Since(t)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && v.ID != id {
					err = fmt.Errorf("wrong value %+v", v)
				}
				if err != nil {
					if res.Errors == 0 {
						res.FirstError = err.Error()
					}
					res.Errors++
				}
				res.Latency = append(res.Latency, d)
			}()
		}
		wg.Wait()
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// HotKeyResult: workload 4.
type HotKeyResult struct {
	Contender      string
	Seconds        float64
	Gets           int64
	LoaderCalls    int64
	LoadsPerSecond float64
	Expiries       float64 // how many times the TTL ran out during the run
	P99            time.Duration
	Max            time.Duration // the slowest Get
	Slow           int64         // Gets that took as long as a load (LoadTime) or longer: callers that waited for one
	TTL, LoadTime  time.Duration // the key's TTL and the loader's time (-hot-ttl, -hot-load)

	GetsRuns []int64         // Gets of each round (medianHot)
	MaxRuns  []time.Duration // the slowest Get of each round
}

// medianHot is a contender's hot-key row over its rounds: the round with
// the median Gets, with Max the median of the rounds' slowest Gets, and
// every round's Gets and slowest Get kept beside.
func medianHot(runs []HotKeyResult) HotKeyResult {
	byGets := slices.Clone(runs)
	slices.SortFunc(byGets, func(a, b HotKeyResult) int { return cmp.Compare(a.Gets, b.Gets) })
	m := byGets[len(byGets)/2]
	maxes := make([]time.Duration, len(runs))
	for i, r := range runs {
		m.GetsRuns = append(m.GetsRuns, r.Gets)
		maxes[i] = r.Max
	}
	m.MaxRuns = slices.Clone(maxes)
	slices.Sort(maxes)
	m.Max = maxes[len(maxes)/2]
	return m
}

// hotPauseDefault is each hot-key client's pause between Gets in table 4;
// table 4b runs with none (see hotKey).
const hotPauseDefault = 100 * time.Microsecond

// Hot-key shape by default: the key's TTL and the loader's time. The TTL
// is 1 s: go-zero stores TTLs in whole seconds and go-redis/cache replaces
// any TTL under a second with its 1-hour default. -hot-ttl and -hot-load
// change them (see hotShape).
const (
	hotTTLDefault  = time.Second
	hotLoadDefault = 10 * time.Millisecond
)

// hotShape is the hot key's TTL and loader time for a run.
type hotShape struct{ ttl, load time.Duration }

// check refuses a TTL that contender cannot keep: go-zero stores whole
// seconds, and go-redis/cache replaces a TTL under a second with its
// 1-hour default, so either would run a different workload than its row
// says.
func (h hotShape) check(contender string) error {
	if h.ttl <= 0 || h.load <= 0 {
		return fmt.Errorf("hot key: TTL %v and load %v must be positive", h.ttl, h.load)
	}
	if strings.HasPrefix(contender, "go-zero") && h.ttl%time.Second != 0 {
		return fmt.Errorf("%s keeps TTLs in whole seconds, not %v (leave it out with -only)", contender, h.ttl)
	}
	if strings.HasPrefix(contender, "go-redis/cache") && h.ttl < time.Second {
		return fmt.Errorf("%s replaces a TTL under 1s (%v) with its 1-hour default (leave it out with -only)", contender, h.ttl)
	}
	return nil
}

// hotKey: 32 goroutines on one key whose TTL is short, for several seconds.
func hotKey(ctx context.Context, e *env, name string, d, pause time.Duration, shape hotShape) (HotKeyResult, error) {
	if err := shape.check(name); err != nil {
		return HotKeyResult{}, err
	}
	ttl, loadTime := shape.ttl, shape.load
	c, _, err := e.build(ctx, name, "hot", ttl, []string{"hot"})
	if err != nil {
		return HotKeyResult{}, err
	}
	defer c.Close()
	var calls atomic.Int64
	load := func(ctx context.Context, id string) (Value, error) {
		calls.Add(1)
		time.Sleep(loadTime)
		return value(id), nil
	}
	// 32 clients, each asking again pause after its answer. Spinning
	// goroutines that never block would measure the scheduler instead: on
	// two cores, 32 of them wait up to hundreds of milliseconds for their
	// turn even around a function that returns a constant, which hid the
	// waits this row is about (a caller waiting for a load). The pause
	// paces the Gets column, though: a 100 µs sleep in a process with
	// nothing else to do lasts about a millisecond (the network poller
	// waits in whole milliseconds), so with in-process caches that column
	// counts timer wake-ups more than hits. With pause 0 (table 4b) each
	// client yields between Gets instead: no goroutine holds a processor
	// for long, and the column measures what a hit costs.
	const workers = 32
	// Warm: the first load is not one the row is about.
	if _, err := c.Get(ctx, "hot", load); err != nil {
		return HotKeyResult{}, fmt.Errorf("%s: warm-up: %w", name, err)
	}
	calls.Store(0)
	// Each client keeps its slowest Get and its count of slow ones exactly,
	// and a reservoir sample of its latencies for the p99. Nothing is
	// allocated per Get: a log growing with the Gets made the runner's own
	// garbage grow with a contender's speed (7 million Gets a round with an
	// in-process cache: a collection every 20 to 100 ms, each marking for
	// up to 30 ms on the two cores the callers share), and the slowest-Get
	// column then measured the runner's collector as much as the contender.
	type tally struct {
		max  time.Duration
		slow int64
	}
	tallies := make([]tally, workers)
	samples := make([]*reservoir, workers)
	for i := range samples {
		samples[i] = newReservoir(1<<15, uint64(i))
	}
	var gets atomic.Int64
	var firstErr atomic.Value
	runtime.GC()
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl := &tallies[w]
			for time.Now().Before(stop) {
				t := time.Now()
				if _, err := c.Get(ctx, "hot", load); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				took := time.Since(t)
				tl.max = max(tl.max, took)
				if took >= loadTime {
					tl.slow++
				}
				samples[w].add(took)
				gets.Add(1)
				if pause > 0 {
					time.Sleep(pause)
				} else {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return HotKeyResult{}, fmt.Errorf("%s: %w", name, err)
	}
	var slowest time.Duration
	var slow int64
	for _, tl := range tallies {
		slowest = max(slowest, tl.max)
		slow += tl.slow
	}
	all := sorted(samples)
	return HotKeyResult{Contender: name, Seconds: d.Seconds(), Gets: gets.Load(), LoaderCalls: calls.Load(),
		LoadsPerSecond: float64(calls.Load()) / d.Seconds(), Expiries: d.Seconds() / ttl.Seconds(), P99: pct(all, 0.99), Max: slowest,
		Slow: slow, TTL: ttl, LoadTime: loadTime}, nil
}

// AvalancheResult: workload 5.
type AvalancheResult struct {
	Contender string
	Keys      int
	TTL       time.Duration
	Min, Max  time.Duration
	StdDev    time.Duration
	Spread    float64 // (max − min) / TTL
}

// avalanche: 5,000 keys loaded at once; how are their TTLs spread?
func avalanche(ctx context.Context, e *env, name string) (AvalancheResult, error) {
	const ttl = 10 * time.Minute
	keys := ids("a", 5000)
	c, _, err := e.build(ctx, name, "aval", ttl, keys)
	if err != nil {
		return AvalancheResult{}, err
	}
	defer c.Close()
	load := func(ctx context.Context, id string) (Value, error) { return value(id), nil }
	if err := parallel(len(keys), 64, func(i int) error { _, err := c.Get(ctx, keys[i], load); return err }); err != nil {
		return AvalancheResult{}, fmt.Errorf("%s: %w", name, err)
	}
	pipe := e.admin.Pipeline()
	cmds := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.PTTL(ctx, c.RedisKey(k))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return AvalancheResult{}, err
	}
	r := AvalancheResult{Contender: name, Keys: len(keys), TTL: ttl, Min: time.Duration(math.MaxInt64)}
	var sum, sq float64
	for i, cmd := range cmds {
		d := cmd.Val()
		if d <= 0 {
			return AvalancheResult{}, fmt.Errorf("%s: key %s has PTTL %v", name, c.RedisKey(keys[i]), d)
		}
		r.Min, r.Max = min(r.Min, d), max(r.Max, d)
		sum += float64(d)
		sq += float64(d) * float64(d)
	}
	n := float64(len(cmds))
	r.StdDev = time.Duration(math.Sqrt(max(sq/n-(sum/n)*(sum/n), 0)))
	r.Spread = float64(r.Max-r.Min) / float64(ttl)
	return r, nil
}

// MemoryResult: workload 6.
type MemoryResult struct {
	Filter        string
	Items         int
	TargetFP      float64
	Bytes         int64
	BoundBytes    float64 // n·log2(1/p)/8
	VsBound       float64
	MeasuredFP    float64
	BitsPerItem   float64
	TestedAbsents int
}

// memory: bytes in Redis for 1,000,000 IDs in each bloom filter at a 1%
// target, and the false-positive rate measured over 100,000 absent IDs.
func memory(ctx context.Context, e *env) ([]MemoryResult, error) {
	const n, absents, p = 1_000_000, 100_000, 0.01
	bound := n * math.Log2(1/p) / 8
	items := ids("m", n)
	absent := ids("x", absents)
	var out []MemoryResult

	// cacheguard: sized from n and p.
	rdb := redis.NewClient(&redis.Options{Addr: e.addr})
	defer rdb.Close()
	g, err := guard.New(
		ctx,
		rdb,
		"mem",
		&guard.Options{KeyPrefix: e.prefix("cacheguard", "mem"), Filter: guard.FilterOptions{ExpectedItems: n, FalsePositiveRate: p}},
	)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for _, id := range items {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		return nil, err
	}
	in, err := g.Info(ctx)
	if err != nil {
		return nil, err
	}
	var fp atomic.Int64
	if err := parallel(absents, 32, func(i int) error {
		ok, err := g.MayExist(ctx, absent[i])
		if ok {
			fp.Add(1)
		}
		return err
	}); err != nil {
		return nil, err
	}
	out = append(out, MemoryResult{Filter: "cacheguard (n=1e6, p=1%)", Items: n, TargetFP: p, Bytes: in.MemoryBytes,
		BoundBytes: bound, VsBound: float64(in.MemoryBytes) / bound, MeasuredFP: float64(fp.Load()) / absents,
		BitsPerItem: float64(in.Config.Bits) / n, TestedAbsents: absents})

	// go-zero: k is fixed at 14; its docs advise bits = 20 × elements.
	rds := zredis.New(e.addr, zredis.WithIdentity())
	key := e.prefix("go-zero", "mem") + ":bloom"
	f := zbloom.New(rds, key, 20*n)
	// One call of each script first, alone: go-zero's client counts the
	// NOSCRIPT of a script's first EVALSHA as a failure, and 64 of them at
	// once open its circuit breaker (a run whose -only left out
	// go-zero+bloom, which otherwise loads both scripts earlier).
	if err := f.AddCtx(ctx, []byte(items[0])); err != nil {
		return nil, err
	}
	if _, err := f.ExistsCtx(ctx, []byte(absent[0])); err != nil {
		return nil, err
	}
	if err := parallel(n, 64, func(i int) error { return f.AddCtx(ctx, []byte(items[i])) }); err != nil {
		return nil, err
	}
	bytes, err := e.admin.MemoryUsage(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	fp.Store(0)
	if err := parallel(absents, 32, func(i int) error {
		ok, err := f.ExistsCtx(ctx, []byte(absent[i]))
		if ok {
			fp.Add(1)
		}
		return err
	}); err != nil {
		return nil, err
	}
	out = append(out, MemoryResult{Filter: "go-zero bloom (20 bits/item, k=14, as its docs advise)", Items: n, TargetFP: p, Bytes: bytes,
		BoundBytes: bound, VsBound: float64(bytes) / bound, MeasuredFP: float64(fp.Load()) / absents,
		BitsPerItem: 20, TestedAbsents: absents})
	return out, nil
}
