// Command benchmarks runs cacheguard and the libraries users would otherwise
// pick through the same workloads, on the same Redis, data and machine, in
// one run, and prints markdown tables (and writes JSON).
//
//	go run . [-hit 3s] [-hit-rounds 5] [-hot 5s] [-hot-rounds 3] [-json FILE]  (make bench)
//	go run . -hot-only | -stale-only [-only cacheguard+local,...]  (table 4 or 7 alone)
//
// Contenders: raw (go-redis GET, on a miss load + SET), the same on rueidis,
// go-zero's cache with and without its bloom, go-redis/cache with and
// without its TinyLFU, rueidis's DoCache, rueidisaside, and guard.Get with
// default options, Local, RefreshAhead and both (contenders.go). The hit
// path also runs references (hitReferences); table 7 measures how long an
// in-process copy stays stale after another client's write (stale.go).
// Every figure is measured in this run; any contender error stops it.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// Report is everything one run measured.
type Report struct {
	Date        string
	Machine     string
	Redis       string
	Hit         []HitResult
	Penetration []PenetrationResult
	Stampede    []StampedeResult
	HotKey      []HotKeyResult // clients pause 100 µs between Gets
	HotKeyYield []HotKeyResult // clients yield the processor between Gets instead
	// HotKeyAtOnce: clients ask again at once, TTL 200 ms, loader 20 ms,
	// 4 clients then 32 (hotAtOnce).
	HotKeyAtOnce [][]HotKeyResult
	Avalanche    []AvalancheResult
	Memory       []MemoryResult
	Staleness    []StaleResult
}

func main() {
	logx.Disable() // go-zero logs cache stats every minute otherwise
	ctx := context.Background()
	if len(os.Args) == 5 && os.Args[1] == "child" {
		if err := runChild(ctx, os.Args[2], os.Args[3], os.Args[4]); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 5 && os.Args[1] == "watch" {
		if err := runWatch(ctx, os.Args[2], os.Args[3], os.Args[4]); err != nil {
			fmt.Fprintln(os.Stderr, "watch:", err)
			os.Exit(1)
		}
		return
	}
	hit := flag.Duration("hit", 3*time.Second, "length of the hit-path run per contender")
	hitRounds := flag.Int("hit-rounds", 5, "hit-path rounds, the contenders' order rotated each round; the table shows the medians")
	hot := flag.Duration("hot", 5*time.Second, "length of the hot-key run per contender")
	hotRounds := flag.Int("hot-rounds", 3, "hot-key and staleness rounds, the order rotated each round; the tables show the medians")
	jsonPath := flag.String("json", filepath.Join("results", "latest.json"), "where to write the JSON report")
	only := flag.String("only", "", "comma-separated contenders to run (raw always runs first in the list); empty: all")
	hitOnly := flag.Bool("hit-only", false, "run the hit path only and print its table (for quick comparisons)")
	hotPause := flag.Duration(
		"hot-pause",
		hotPauseDefault,
		"with -hot-only: each hot-key client's pause between Gets (0: it yields the processor instead; -1ns: it asks again at once); "+
			"a full run shows 100µs and 0, then asking at once (table 4c: TTL 200ms, load 20ms, 4 and 32 clients)",
	)
	hotTTL := flag.Duration(
		"hot-ttl",
		hotTTLDefault,
		"the hot key's TTL (under 1s, or not whole seconds: leave go-redis/cache and go-zero out with -only)",
	)
	hotLoad := flag.Duration("hot-load", hotLoadDefault, "the hot key's loader time")
	hotOnly := flag.Bool("hot-only", false, "run the hot-key workload only and print its table (for quick comparisons)")
	hotClients := flag.Int("hot-clients", 32, "with -hot-only: the hot key's clients")
	staleOnly := flag.Bool("stale-only", false, "run the staleness workload only and print its table (table 7)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchmarks:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *only != "" {
		keep := []string{"raw"}
		all := append(slices.Clone(contenderNames), hitReferences...)
		for _, n := range strings.Split(*only, ",") {
			if n = strings.TrimSpace(n); n != "" && n != "raw" {
				if !slices.Contains(all, n) {
					fmt.Fprintf(os.Stderr, "benchmarks: unknown contender %q (have %s)\n", n, strings.Join(all, ", "))
					os.Exit(2)
				}
				keep = append(keep, n)
			}
		}
		hitReferences = slices.DeleteFunc(slices.Clone(hitReferences), func(n string) bool { return !slices.Contains(keep, n) })
		contenderNames = slices.DeleteFunc(keep, func(n string) bool { return slices.Contains(hitReferences, n) })
	}
	stopAfterHit, hotKeyOnly, staleKeyOnly = *hitOnly, *hotOnly, *staleOnly
	hotOnlyPause = *hotPause
	hotKeyShape = hotShape{ttl: *hotTTL, load: *hotLoad, clients: *hotClients}
	if err := run(ctx, *hit, *hitRounds, *hot, *hotRounds, *jsonPath, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(ctx context.Context, hitTime time.Duration, hitRounds int, hotTime time.Duration, hotRounds int, jsonPath string, w io.Writer) error {
	port, err := redisserver.FreePort(false)
	if err != nil {
		return err
	}
	srv, err := redisserver.Start(ctx, &redisserver.Options{Port: port})
	if err != nil {
		return err
	}
	defer srv.Stop()
	admin := redis.NewClient(srv.Options())
	defer admin.Close()
	e := &env{addr: srv.Addr, admin: admin, run: strconv.FormatInt(time.Now().Unix()%100000, 10), hitTime: hitTime}
	version, _ := admin.Info(ctx, "server").Result()
	rep := &Report{Date: time.Now().UTC().Format("2006-01-02"), Machine: machine(), Redis: field(version, "redis_version")}

	start := time.Now()
	step := func(what string) { fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), what) }
	// rotated runs every contender once per round, the order rotated each
	// round: this machine's noise moves a single run a lot, and whoever
	// runs first or last has an edge. Each contender's row is then a median
	// over its rounds.
	rotated := func(what string, names []string, rounds int, run func(round int, name string) error) error {
		for round := range max(rounds, 1) {
			for i := range names {
				name := names[(i+round)%len(names)]
				step(fmt.Sprintf("%s, round %d: %s", what, round+1, name))
				if err := run(round, name); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// The hot key's rows differ by a few percent between contenders, less
	// than one run's noise: the median of hotRounds. It runs twice, with
	// the clients pausing between Gets and with them yielding (see hotKey).
	hot := func(pause time.Duration, shape hotShape, names []string) ([]HotKeyResult, error) {
		runs := map[string][]HotKeyResult{}
		what := fmt.Sprintf("hot key (pause %v, %d clients)", pause, cmp.Or(shape.clients, 32))
		if err := rotated(what, names, hotRounds, func(_ int, name string) error {
			r, err := hotKey(ctx, e, name, hotTime, pause, shape)
			runs[name] = append(runs[name], r)
			return err
		}); err != nil {
			return nil, err
		}
		var out []HotKeyResult
		for _, name := range names {
			out = append(out, medianHot(runs[name]))
		}
		return out, nil
	}
	// Staleness: the cases whose reader is among the contenders (-only),
	// the median of hotRounds each.
	stale := func() ([]StaleResult, error) {
		var cases []staleCase
		for _, c := range staleCases {
			if slices.Contains(contenderNames, c.reader) || slices.Contains(hitReferences, c.reader) {
				cases = append(cases, c)
			}
		}
		labels := make([]string, len(cases))
		for i, c := range cases {
			labels[i] = c.label()
		}
		runs := map[string][]StaleResult{}
		if err := rotated("staleness", labels, hotRounds, func(round int, label string) error {
			r, err := staleness(ctx, e, cases[slices.Index(labels, label)], round)
			runs[label] = append(runs[label], r)
			return err
		}); err != nil {
			return nil, err
		}
		var out []StaleResult
		for _, label := range labels {
			out = append(out, medianStale(runs[label]))
		}
		return out, nil
	}
	if staleKeyOnly {
		rs, err := stale()
		if err != nil {
			return err
		}
		fmt.Fprint(w, markdownStale(rs))
		return nil
	}
	if hotKeyOnly {
		rs, err := hot(hotOnlyPause, hotKeyShape, contenderNames)
		if err != nil {
			return err
		}
		number := "4"
		switch {
		case hotOnlyPause == 0:
			number = "4b"
		case hotOnlyPause < 0:
			number = "4c"
		}
		fmt.Fprint(w, markdownHot(number, rs, hotOnlyPause))
		return nil
	}
	// The hit path: each row is the contender's median round, and "vs raw"
	// the median of its same-round ratios to raw.
	hitNames := append(slices.Clone(contenderNames), hitReferences...)
	runs := map[string][]HitResult{}
	byRound := make([]map[string]HitResult, max(hitRounds, 1)) // for the same-round ratios to raw
	if err := rotated("hit path", hitNames, hitRounds, func(round int, name string) error {
		r, err := hitPath(ctx, e, name, round)
		if err == nil { // each round's, to tell a slow round's cause (the tables keep the median's)
			step(fmt.Sprintf("  %.0f ops/s, %.3f round trips/Get, CPU/Get %v + %v", r.OpsPerSec, r.TripsPerGet, r.ClientCPU, r.ServerCPU))
		}
		if byRound[round] == nil {
			byRound[round] = map[string]HitResult{}
		}
		byRound[round][name] = r
		return err
	}); err != nil {
		return err
	}
	for _, byName := range byRound {
		for name, r := range byName {
			r.VsRaw = r.OpsPerSec / byName[contenderNames[0]].OpsPerSec
			runs[name] = append(runs[name], r)
		}
	}
	for _, name := range hitNames {
		h := medianHit(runs[name])
		if ref := hitReferenceOf[name]; slices.Contains(hitNames, ref) {
			step(fmt.Sprintf("hit path, interleaved: %s against %s", name, ref))
			ratios, err := interleaved(ctx, e, name, ref)
			if err != nil {
				return err
			}
			vsReference(&h, ratios)
		}
		rep.Hit = append(rep.Hit, h)
	}
	if stopAfterHit {
		fmt.Fprint(w, markdownHit(rep))
		return nil
	}
	for _, name := range contenderNames {
		step("penetration: " + name)
		r, err := penetration(ctx, e, name)
		if err != nil {
			return err
		}
		rep.Penetration = append(rep.Penetration, r)
	}
	for _, name := range contenderNames {
		step("stampede: " + name)
		r, err := stampede(ctx, e, name)
		if err != nil {
			return err
		}
		rep.Stampede = append(rep.Stampede, r)
	}
	if rep.HotKey, err = hot(hotPauseDefault, hotKeyShape, contenderNames); err != nil {
		return err
	}
	if rep.HotKeyYield, err = hot(0, hotKeyShape, contenderNames); err != nil {
		return err
	}
	if names := hotAtOnceNames(); len(names) > 0 {
		for _, clients := range hotAtOnceClients {
			rs, err := hot(-time.Nanosecond, hotShape{ttl: hotAtOnceTTL, load: hotAtOnceLoad, clients: clients}, names)
			if err != nil {
				return err
			}
			rep.HotKeyAtOnce = append(rep.HotKeyAtOnce, rs)
		}
	}
	if rep.Staleness, err = stale(); err != nil {
		return err
	}
	for _, name := range contenderNames {
		step("avalanche: " + name)
		r, err := avalanche(ctx, e, name)
		if err != nil {
			return err
		}
		rep.Avalanche = append(rep.Avalanche, r)
	}
	step("memory")
	if rep.Memory, err = memory(ctx, e); err != nil {
		return err
	}
	step("done")

	fmt.Fprint(w, markdown(rep))
	if jsonPath != "" {
		if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "\nJSON: %s\n", jsonPath)
	}
	return nil
}
