package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/internal/cputime"
)

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
	// Reference is the reference this contender is set against (hitReferenceOf),
	// VsRef the median of VsRefRuns, its ratios to it in ops/s in the pairs
	// of slices interleaved (see interleaved).
	Reference string    `json:",omitempty"`
	VsRef     float64   `json:",omitempty"`
	VsRefRuns []float64 `json:",omitempty"`
}

// hitReferenceOf is what the issue sets each cacheguard hit path against:
// go-redis's own pipelined GET without a local copy, its client-side cache
// with one.
var hitReferenceOf = map[string]string{
	"cacheguard": "go-redis+autopipeline", "cacheguard+plain-client": "go-redis+autopipeline", "cacheguard+local": "go-redis+client-cache",
}

// vsReference sets h's VsRef from ratios, its ops/s against its reference's
// in the pairs of slices interleaved (see interleaved).
func vsReference(h *HitResult, ratios []float64) {
	h.Reference, h.VsRefRuns = hitReferenceOf[h.Contender], slices.Clone(ratios)
	sorted := slices.Sorted(slices.Values(ratios))
	h.VsRef = sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		// Of an even count, the geometric mean of the middle two: the AB
		// pairs and the BA pairs lean opposite ways when the machine's
		// speed drifts, and either middle one alone takes a side.
		h.VsRef = math.Sqrt(sorted[len(sorted)/2-1] * h.VsRef)
	}
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

// hitClient is one contender ready for the hit path: built, its keys warm.
type hitClient struct {
	name string
	c    Contender
	ctr  *counter
	keys []string
}

// hitWorkers is how many goroutines ask at once on the hit path.
const hitWorkers = 64

// warmHit builds name on 10,000 keys of its own (tag tells its runs apart)
// and reads each twice: a client-side cache's first read after the load's
// SET is a miss (the SET invalidated what the GET before it tracked), and
// fills the copy the run is about. The caller closes it.
func warmHit(ctx context.Context, e *env, name, tag string) (*hitClient, error) {
	keys := ids("k", 10_000)
	c, ctr, err := e.build(ctx, name, "hit"+tag, 10*time.Minute, keys)
	if err != nil {
		return nil, err
	}
	h := &hitClient{name: name, c: c, ctr: ctr, keys: keys}
	for range 2 {
		if err := parallel(len(keys), 32, func(i int) error { _, err := c.Get(ctx, keys[i], hitLoad); return err }); err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: warm-up: %w", name, err)
		}
	}
	return h, nil
}

func hitLoad(ctx context.Context, id string) (Value, error) { return value(id), nil }

// loop runs hitWorkers goroutines asking random keys of h for d, and
// returns how many Gets they made and how long they took. samples, if not
// nil, gets one reservoir per worker: every 8th Get is timed (a uniform
// sample for the percentiles). A tight loop: the count is added once at the
// end, and the stop is a flag read at every Get. A clock reading and a
// shared counter at every Get had cost each contender about 40% of its
// ops/s, which made the loop measure the harness as much as the contenders;
// a clock read every 64th Get let the last workers run on alone for up to
// a tenth of a 250 ms slice.
func (h *hitClient) loop(ctx context.Context, d time.Duration, samples []*reservoir) (int64, time.Duration, error) {
	var ops, errs atomic.Int64
	var firstErr atomic.Value
	var stopped atomic.Bool // read at every Get: all stop within a Get of d
	start := time.Now()
	alarm := time.AfterFunc(d, func() { stopped.Store(true) })
	defer alarm.Stop()
	var wg sync.WaitGroup
	for w := range hitWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			timed := samples != nil
			n := 0
			for ; !stopped.Load(); n++ {
				var t time.Time
				if timed && n%8 == 0 {
					t = time.Now()
				}
				_, err := h.c.Get(ctx, h.keys[r.IntN(len(h.keys))], hitLoad)
				if timed && n%8 == 0 {
					samples[w].add(time.Since(t))
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
			ops.Add(int64(n))
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if errs.Load() > 0 {
		return 0, 0, fmt.Errorf("%s: %d errors on the hit path, first: %v", h.name, errs.Load(), firstErr.Load())
	}
	return ops.Load(), elapsed, nil
}

// hitSlice is how long each side of an interleaved pair runs.
const hitSlice = 250 * time.Millisecond

// interleaved sets name against ref in the same stretch of time: both
// warm, then a slice of each in turn, the order alternating (AB, BA, ...),
// e.hitTime of each in all after one pair not counted. It returns each
// pair's ratio of name's ops/s to ref's. This machine's speed moves by a
// third within minutes (docs/benchmarks.md, Method): the rounds' ratios
// carry that, two slices a quarter second apart do not.
func interleaved(ctx context.Context, e *env, name, ref string) ([]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*e.hitTime+time.Minute) // a request's deadline: see hitPath
	defer cancel()
	a, err := warmHit(ctx, e, name, "vs")
	if err != nil {
		return nil, err
	}
	defer a.c.Close()
	b, err := warmHit(ctx, e, ref, "vs")
	if err != nil {
		return nil, err
	}
	defer b.c.Close()
	opsPerSec := func(h *hitClient) func() (float64, error) {
		return func() (float64, error) {
			n, elapsed, err := h.loop(ctx, hitSlice, nil)
			return float64(n) / elapsed.Seconds(), err
		}
	}
	return alternate(max(int(e.hitTime/hitSlice), 1), opsPerSec(a), opsPerSec(b))
}

// alternate measures a and b in turn, pairs+1 times, the order alternating
// (AB, BA, AB, ...), and returns each pair's a/b but the first's: a drift
// of the machine's speed then moves half the ratios up and half down.
func alternate(pairs int, a, b func() (float64, error)) ([]float64, error) {
	ratios := make([]float64, 0, pairs)
	for i := range pairs + 1 {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		x, err := first()
		if err != nil {
			return nil, err
		}
		y, err := second()
		if err != nil {
			return nil, err
		}
		if i%2 == 1 {
			x, y = y, x
		}
		if i > 0 { // the first pair warms both up
			ratios = append(ratios, x/y)
		}
	}
	return ratios, nil
}

// hitPath: 10,000 warm keys, 64 goroutines for a fixed time.
func hitPath(ctx context.Context, e *env, name string, round int) (HitResult, error) {
	// A deadline, as a request's context has: rueidisaside puts a timeout of
	// the TTL (10 minutes here) on every Get whose context has none or a
	// later one, and that timer would cost it a tenth of its hit path.
	ctx, cancel := context.WithTimeout(ctx, e.hitTime+time.Minute)
	defer cancel()
	h, err := warmHit(ctx, e, name, strconv.Itoa(round))
	if err != nil {
		return HitResult{}, err
	}
	defer h.c.Close()
	samples := make([]*reservoir, hitWorkers)
	for i := range samples {
		samples[i] = newReservoir(1<<17, uint64(i))
	}
	trips0 := h.ctr.RoundTrips()
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
	ops, elapsed, err := h.loop(ctx, e.hitTime, samples)
	if err != nil {
		return HitResult{}, err
	}
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
	all := sorted(samples)
	n := float64(ops)
	return HitResult{
		Contender: name, Ops: ops, OpsPerSec: n / elapsed.Seconds(),
		P50: pct(all, 0.5), P99: pct(all, 0.99),
		TripsPerGet:     float64(h.ctr.RoundTrips()-trips0) / n,
		ServerCmdsPerOp: float64(server1-server0-1) / n,
		AllocsPerOp:     float64(m1.Mallocs-m0.Mallocs) / n,
		ClientCPU:       time.Duration(float64(ccpu1-ccpu0) / n),
		ServerCPU:       time.Duration(float64(scpu1-scpu0) / n),
	}, nil
}
