package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The attack's scenarios and paths, as -only and -paths name them.
var (
	scenarioNames = []string{"penetration", "stampede", "zipf"}
	pathNames     = []string{"naive", "guard", "local", "refresh"}
)

// attackOptions sizes the load run.
type attackOptions struct {
	Duration time.Duration // per scenario and path
	// Rounds splits each path's Duration in this many slices, the paths of
	// a scenario alternated slice by slice (the order reversed every other
	// round), so that a change in the machine's load falls on all of them;
	// 0 or 1: one run per path.
	Rounds     int
	Workers    int // concurrent clients for penetration and Zipf traffic
	Burst      int // concurrent GETs after each invalidation (stampede)
	HotProduct string
	Products   int // IDs 1..Products exist (Zipf draws from them)
	// Scenarios, if not empty, names the scenarios to run (penetration,
	// stampede, zipf); the others are left out.
	Scenarios []string
	// Paths, if not empty, names the paths to run (naive, guard, local,
	// refresh): each scenario runs those of them it has. An A/B of one
	// path between two builds then spends no time on the others.
	Paths    []string
	Progress io.Writer
	// OnPhase, if set, is told "<scenario> <path>" as each run starts, and
	// "" when the attack ends (the dashboard labels its charts with it).
	OnPhase func(string)
}

// result is one row of the table.
type result struct {
	Scenario, Path             string
	Requests, DBQueries, Redis int64
	Errors                     int64
	P50, P99                   time.Duration
	Invalidations              int64
	// CPU per request, in microseconds, of the shop's process (with the
	// load generator in it under "shop demo") and of redis-server; NaN
	// when /metrics could not say.
	ShopCPU, RedisCPU float64
	// Slices holds the requests of each round; Load the median of the
	// machine's 1-minute load average after each (NaN off Linux).
	Slices []int64
	Load   float64
}

// counters are what /metrics says about one path, and the CPU seconds of
// the shop's process and of redis-server so far.
type counters struct {
	db, redis     int64
	cpu, redisCPU float64
}

func scrape(ctx context.Context, client *http.Client, base, path string) (counters, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	resp, err := client.Do(req)
	if err != nil {
		return counters{}, err
	}
	defer resp.Body.Close()
	c := counters{cpu: math.NaN(), redisCPU: math.NaN()}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		v, _ := strconv.ParseFloat(f[len(f)-1], 64) // the text format writes 1e+06
		switch {
		case strings.HasPrefix(line, `shop_db_queries_total{path="`+path+`"}`):
			c.db = int64(v)
		case strings.HasPrefix(line, `shop_redis_commands_total{path="`+path+`"}`):
			c.redis = int64(v)
		case strings.HasPrefix(line, "process_cpu_seconds_total "):
			c.cpu = v
		case strings.HasPrefix(line, "shop_redis_cpu_seconds_total "):
			c.redisCPU = v
		}
	}
	return c, sc.Err()
}

// attack runs every scenario against the naive baseline and the guarded
// routes of the shop at base, and returns the rows.
func attack(ctx context.Context, base string, o attackOptions) ([]result, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute,
	}}
	defer client.CloseIdleConnections()
	paths := map[string]string{"naive": "/naive/products/", "guard": "/products/",
		"local": "/local/products/", "refresh": "/refresh/products/"}
	type scen struct {
		name  string
		run   func(ctx context.Context, prefix string, rec *recorder) int64
		paths []string // default: naive and guard
	}
	scenarios := []scen{
		{"penetration", func(ctx context.Context, prefix string, rec *recorder) int64 {
			// Random IDs that do not exist: the database must not pay for them.
			workers(ctx, o.Workers, func(r *rand.Rand) {
				rec.get(ctx, client, base+prefix+strconv.Itoa(10_000_000+r.IntN(1_000_000_000)), 404)
			})
			return 0
		}, nil},
		{"stampede", func(ctx context.Context, prefix string, rec *recorder) int64 {
			// The hot product's cached copy is dropped (as when it
			// expires), then Burst clients ask for it at once; again and
			// again.
			var rounds int64
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "DELETE", base+"/cache/products/"+o.HotProduct, nil)
				resp, err := client.Do(req)
				if err != nil {
					break
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					rec.errors.Add(1)
					continue
				}
				rounds++
				var wg sync.WaitGroup
				start := make(chan struct{})
				for range o.Burst {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						rec.get(context.WithoutCancel(ctx), client, base+prefix+o.HotProduct, 200)
					}()
				}
				close(start)
				wg.Wait()
			}
			return rounds
		}, nil},
		{"zipf", func(ctx context.Context, prefix string, rec *recorder) int64 {
			// Ordinary traffic: a few popular products, a long tail.
			workers(ctx, o.Workers, func(r *rand.Rand) {
				z := rand.NewZipf(r, 1.1, 1, uint64(o.Products-1))
				rec.get(ctx, client, base+prefix+strconv.FormatUint(1+z.Uint64(), 10), 200)
			})
			return 0
		}, []string{"naive", "guard", "local", "refresh"}},
	}
	var out []result
	if o.OnPhase != nil {
		defer o.OnPhase("")
	}
	rounds := max(o.Rounds, 1)
	slice := o.Duration / time.Duration(rounds)
	for _, sc := range scenarios {
		if len(o.Scenarios) > 0 && !slices.Contains(o.Scenarios, sc.name) {
			continue
		}
		ps := sc.paths
		if ps == nil {
			ps = []string{"naive", "guard"}
		}
		ps = slices.DeleteFunc(slices.Clone(ps), func(p string) bool { return len(o.Paths) > 0 && !slices.Contains(o.Paths, p) })
		rows := make([]result, len(ps))
		recs := make([]*recorder, len(ps))
		loads := make([][]float64, len(ps))
		for i, path := range ps {
			rows[i] = result{Scenario: sc.name, Path: path}
			recs[i] = &recorder{}
		}
		for round := range rounds {
			for k := range ps {
				i := k
				if round%2 == 1 {
					i = len(ps) - 1 - k
				}
				path, rec, row := ps[i], recs[i], &rows[i]
				before, err := scrape(ctx, client, base, path)
				if err != nil {
					return nil, err
				}
				if o.OnPhase != nil {
					o.OnPhase(sc.name + " " + path)
				}
				served := rec.n.Load()
				rctx, cancel := context.WithTimeout(ctx, slice)
				label := path
				if rounds > 1 {
					label = fmt.Sprintf("%s %d/%d", path, round+1, rounds)
				}
				stopProgress := progress(o.Progress, sc.name, label, rec)
				row.Invalidations += sc.run(rctx, paths[path], rec)
				cancel()
				stopProgress()
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				after, err := scrape(ctx, client, base, path)
				if err != nil {
					return nil, err
				}
				row.DBQueries += after.db - before.db
				row.Redis += after.redis - before.redis
				row.ShopCPU += after.cpu - before.cpu
				row.RedisCPU += after.redisCPU - before.redisCPU
				row.Slices = append(row.Slices, rec.n.Load()-served)
				loads[i] = append(loads[i], loadAverage())
			}
		}
		for i := range rows {
			rec, row := recs[i], &rows[i]
			row.Requests, row.Errors = rec.n.Load(), rec.errors.Load()
			row.P50, row.P99 = rec.percentiles()
			row.ShopCPU *= 1e6 / float64(max(row.Requests, 1)) // seconds in all, to µs per request
			row.RedisCPU *= 1e6 / float64(max(row.Requests, 1))
			row.Load = median(loads[i])
		}
		out = append(out, rows...)
	}
	return out, nil
}

// loadAverage is the machine's 1-minute load average, or NaN where
// /proc/loadavg does not say.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// median of vs (NaN for none); vs is sorted in place.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

// workers runs fn in n goroutines until ctx is done.
func workers(ctx context.Context, n int, fn func(r *rand.Rand)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				fn(r)
			}
		}()
	}
	wg.Wait()
}

// recorder collects request counts, errors and latencies.
type recorder struct {
	n, errors atomic.Int64
	mu        sync.Mutex // guards lat
	lat       []time.Duration
}

func (rec *recorder) get(ctx context.Context, client *http.Client, url string, want int) {
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			rec.errors.Add(1)
			rec.n.Add(1)
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	rec.n.Add(1)
	if resp.StatusCode != want {
		rec.errors.Add(1)
	}
	rec.mu.Lock()
	rec.lat = append(rec.lat, took)
	rec.mu.Unlock()
}

func (rec *recorder) percentiles() (p50, p99 time.Duration) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.lat) == 0 {
		return 0, 0
	}
	slices.Sort(rec.lat)
	return rec.lat[len(rec.lat)/2], rec.lat[len(rec.lat)*99/100]
}

// progress prints a live request count until stop is called.
func progress(w io.Writer, scenario, path string, rec *recorder) (stop func()) {
	if w == nil || w == io.Discard {
		return func() {}
	}
	// On a terminal the line is redrawn in place; elsewhere (logs, CI) each
	// update is a line of its own, once a second.
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	every, line := time.Second, "  %-12s %-7s %8d requests\n"
	if tty {
		every, line = 250*time.Millisecond, "\r  %-12s %-7s %8d requests"
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() { // owned by the caller of progress; ends when stop is called
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				if tty {
					fmt.Fprint(w, "\r")
				}
				fmt.Fprintf(w, "  %-12s %-7s %8d requests, done\n", scenario, path, rec.n.Load())
				return
			case <-t.C:
				fmt.Fprintf(w, line, scenario, path, rec.n.Load())
			}
		}
	}()
	return func() { close(done); <-finished }
}

// table renders the rows as a markdown table.
func table(rows []result) string {
	var b bytes.Buffer
	fmt.Fprintln(&b, "| scenario | path | requests | DB queries | Redis commands | p50 | p99 | errors | "+
		"requests per round (median) | load | shop CPU/request | Redis CPU/request |")
	fmt.Fprintln(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	micros := func(v float64) string {
		if math.IsNaN(v) {
			return "n/a"
		}
		return fmt.Sprintf("%.0f µs", v)
	}
	for _, r := range rows {
		name := r.Scenario
		if r.Invalidations > 0 {
			name = fmt.Sprintf("%s (%d invalidations)", r.Scenario, r.Invalidations)
		}
		perRound := make([]float64, len(r.Slices))
		for i, n := range r.Slices {
			perRound[i] = float64(n)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %s | %s | %d | %.0f | %s | %s | %s |\n", name, r.Path, r.Requests, r.DBQueries, r.Redis,
			r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.Errors, median(perRound), load(r.Load),
			micros(r.ShopCPU), micros(r.RedisCPU))
	}
	return b.String()
}

// load formats a load average ("n/a" when unknown).
func load(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}
