package main

import (
	"cmp"
	"context"
	"fmt"
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
	// VsRef the median of VsRefRuns, its same-round ratios to it in ops/s.
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

// vsReference sets h's VsRef from the rounds' results, if h has a
// reference that ran in every round it did.
func vsReference(h *HitResult, byRound []map[string]HitResult) {
	ref := hitReferenceOf[h.Contender]
	var ratios []float64
	for _, byName := range byRound {
		r, ok := byName[ref]
		if c, ok2 := byName[h.Contender]; ok && ok2 {
			ratios = append(ratios, c.OpsPerSec/r.OpsPerSec)
		}
	}
	if len(ratios) == 0 {
		return
	}
	h.Reference, h.VsRefRuns = ref, slices.Clone(ratios)
	slices.Sort(ratios)
	h.VsRef = ratios[len(ratios)/2]
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
	// Two passes: a client-side cache's first read after the load's SET is
	// a miss (the SET invalidated what the GET before it tracked), and
	// fills the copy the run is about.
	for range 2 {
		if err := parallel(len(keys), 32, func(i int) error { _, err := c.Get(ctx, keys[i], load); return err }); err != nil {
			return HitResult{}, fmt.Errorf("%s: warm-up: %w", name, err)
		}
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
			n := 0
			for ; n%64 != 0 || time.Now().Before(stop); n++ {
				// A tight loop: every 8th Get is timed (a uniform sample for
				// the percentiles), the count is added once at the end. A clock
				// reading and a shared counter at every Get had cost each
				// contender about 40% of its ops/s, which made the loop measure
				// the harness as much as the contenders.
				var t time.Time
				if n%8 == 0 {
					t = time.Now()
				}
				_, err := c.Get(ctx, keys[r.IntN(len(keys))], load)
				if n%8 == 0 {
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
