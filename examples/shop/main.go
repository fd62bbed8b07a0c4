// Command shop is a small but real shop service that reads through
// cacheguard, and a load generator that shows what the guard saves.
//
//	shop demo   [-exit] [-duration 3s] [-rounds 3] [-chart demo.png] [-only zipf]
//	shop serve  [-addr 127.0.0.1:8080]
//	shop attack -url http://127.0.0.1:8080 [-duration 3s] [-only ...]
//
// Data lives in SQLite (a temporary file, or -db) unless DATABASE_URL names a
// PostgreSQL database; Redis is REDIS_URL, or a redis-server the command
// starts itself. The routes (guarded, in-process, refresh-ahead and naive
// reads, the writes, /metrics and /dashboard) are listed in routes.go and
// docs/demo.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, args := "demo", os.Args[1:]
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "demo", "serve":
		err = runServe(ctx, cmd == "demo", args, os.Stdout, os.Stderr)
	case "attack":
		err = runAttack(ctx, args, os.Stdout, os.Stderr)
	default:
		err = fmt.Errorf("unknown command %q (demo, serve, attack)", cmd)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "shop:", err)
		os.Exit(1)
	}
}

func runServe(ctx context.Context, demo bool, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shop", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	dbPath := fs.String("db", "", "SQLite file to keep (when DATABASE_URL is not set); default: a temporary one, removed on exit")
	dbLatency := fs.Duration("db-latency", 2*time.Millisecond, "added to every query, as a networked database's round trip would be")
	exit := fs.Bool("exit", false, "demo: exit after printing the table")
	chart := fs.String("chart", "", "demo: also draw the table as a chart into this file (.png, .svg or .pdf)")
	duration := fs.Duration("duration", 3*time.Second, "demo: length of each scenario on each path")
	rounds := fs.Int("rounds", 3, "demo: split each path's run in this many rounds, the paths alternated round by round")
	echoVersion := fs.Int("echo", 5, "Echo major version serving /products (5, or 4 for the v4 adapter)")
	cpuProfile := fs.String(
		"cpuprofile",
		"",
		"write a CPU profile of the process to this file; handler samples carry a path label (go tool pprof -tagfocus path=guard)",
	)
	only := fs.String("only", "", "demo: run only these scenarios (comma-separated: penetration, stampede, zipf, outside)")
	paths := fs.String(
		"paths",
		"",
		"demo: run only these paths (comma-separated: naive, guard, local, refresh); each scenario runs those of them it has",
	)
	zipfKeys := fs.Int("zipf-keys", 100_000, "demo: the Zipf scenario draws from products 1..N (1,000: a cache that is warm after the first second)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scenarios, err := nameList("only", "scenario", *only, append(slices.Clone(scenarioNames), "outside"))
	if err != nil {
		return err
	}
	runs := func(name string) bool { return len(scenarios) == 0 || slices.Contains(scenarios, name) }
	pathsRun, err := nameList("paths", "path", *paths, pathNames)
	if err != nil {
		return err
	}
	if *zipfKeys < 2 || *zipfKeys > 100_000 {
		return fmt.Errorf("-zipf-keys %d: want 2 to 100,000 (the products seeded)", *zipfKeys)
	}
	if *echoVersion != 4 && *echoVersion != 5 {
		return fmt.Errorf("-echo %d: want 4 or 5", *echoVersion)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	redis.SetLogger(guard.RedisLogger(log)) // go-redis's own lines: each kind once per 10 s, with a count

	redisOpts, stopRedis, err := redisFromEnv(ctx, stdout)
	if err != nil {
		return err
	}
	defer stopRedis()

	dsn := *dbPath
	switch {
	case os.Getenv("DATABASE_URL") != "":
		dsn = os.Getenv("DATABASE_URL")
	case dsn == "": // a temporary SQLite file, removed on exit
		dir, err := os.MkdirTemp("", "cacheguard-shop-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dsn = filepath.Join(dir, "shop.db")
	}
	fmt.Fprintf(stdout, "preparing the database (%s): 100,000 products, 10,000 users\n", redact(dsn))
	db, err := openStore(ctx, dsn)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer db.Close()
	start := time.Now()
	if err := seed(ctx, db, 100_000, 10_000); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(stdout, "database ready in %v; opening the Guards and building their bloom filters\n", time.Since(start).Round(time.Millisecond))

	shop, err := newShop(ctx, db, redisOpts, *dbLatency, log)
	if err != nil {
		return err
	}
	defer shop.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: shop.Handler(*echoVersion), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }() // ends when srv.Shutdown runs below
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	url := "http://" + ln.Addr().String()

	if demo {
		fmt.Fprintf(stdout, "watch it live: %s/dashboard\n", url)
		fmt.Fprintf(
			stdout,
			"attacking %s: each scenario for %v per path, in %d rounds that alternate the paths (DB latency %v)\n",
			url,
			*duration,
			max(*rounds, 1),
			*dbLatency,
		)
		var rows []result
		if slices.ContainsFunc(scenarioNames, runs) {
			if rows, err = attack(ctx, url, attackOptions{Duration: *duration, Rounds: *rounds, Workers: 32, Burst: 100, HotProduct: "1", Products: *zipfKeys,
				Scenarios: scenarios, Paths: pathsRun, Progress: stderr, OnPhase: shop.live.setPhase}); err != nil {
				return err
			}
			fmt.Fprintln(stdout)
			fmt.Fprint(stdout, table(rows))
			fmt.Fprintln(stdout, "\nCPU/request: the shop's process (the load generator runs in it too) and redis-server, over each run."+
				" Load: the machine's 1-minute load average (/proc/loadavg), median over the path's rounds.")
			fmt.Fprintln(stdout)
			fmt.Fprint(stdout, summary(rows))
		}
		if runs("outside") {
			results, err := outside(ctx, stdout, log, shop.live)
			if err != nil {
				return fmt.Errorf("writes from outside the service: %w", err)
			}
			if results != nil {
				outsideTable(stdout, results)
			}
		}
		if *chart != "" && rows != nil {
			caption := fmt.Sprintf("make demo, %s, %d s per scenario and path", time.Now().UTC().Format("2006-01-02"), int(duration.Seconds()))
			if err := writeChart(rows, *chart, caption); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "chart: %s\n", *chart)
		}
		if *exit {
			return nil
		}
	}
	fmt.Fprintf(stdout, "\nshop listening on %s  (try %s/dashboard, %s/products/42, %s/users/7, %s/metrics; Ctrl-C stops)\n", url, url, url, url, url)
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		return err
	}
}

func runAttack(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("attack", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "the shop's base URL")
	duration := fs.Duration("duration", 3*time.Second, "length of each scenario on each path")
	rounds := fs.Int("rounds", 3, "split each path's run in this many rounds, the paths alternated round by round")
	only := fs.String("only", "", "run only these scenarios (comma-separated: penetration, stampede, zipf)")
	paths := fs.String("paths", "", "run only these paths (comma-separated: naive, guard, local, refresh); each scenario runs those of them it has")
	zipfKeys := fs.Int("zipf-keys", 100_000, "the Zipf scenario draws from products 1..N")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scenarios, err := nameList("only", "scenario", *only, scenarioNames)
	if err != nil {
		return err
	}
	pathsRun, err := nameList("paths", "path", *paths, pathNames)
	if err != nil {
		return err
	}
	if *zipfKeys < 2 {
		return fmt.Errorf("-zipf-keys %d: want at least 2", *zipfKeys)
	}
	rows, err := attack(ctx, *url, attackOptions{Duration: *duration, Rounds: *rounds, Workers: 32, Burst: 100, HotProduct: "1", Products: *zipfKeys,
		Scenarios: scenarios, Paths: pathsRun, Progress: stderr})
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, table(rows))
	fmt.Fprintln(stdout, "\nCPU/request: the shop's process and redis-server, over each run (from the shop's /metrics).")
	fmt.Fprint(stdout, summary(rows))
	return nil
}

// summary states the two ratios the demo is about, for the scenarios
// that ran.
func summary(rows []result) string {
	find := func(scenario, path string) (result, bool) {
		for _, r := range rows {
			if r.Scenario == scenario && r.Path == path {
				return r, true
			}
		}
		return result{}, false
	}
	ratio := func(a, b int64) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	var out string
	pn, ok1 := find("penetration", "naive")
	pg, ok2 := find("penetration", "guard")
	if ok1 && ok2 {
		out += fmt.Sprintf("penetration: the guarded path sent %.2f%% of the naive path's DB queries per request (%.4f vs %.4f)\n",
			100*ratio(pg.DBQueries*pn.Requests, pn.DBQueries*pg.Requests), ratio(pg.DBQueries, pg.Requests), ratio(pn.DBQueries, pn.Requests))
	}
	sn, ok1 := find("stampede", "naive")
	sg, ok2 := find("stampede", "guard")
	if ok1 && ok2 {
		out += fmt.Sprintf("stampede: %.2f DB queries per invalidation guarded, %.2f naive\n",
			ratio(sg.DBQueries, sg.Invalidations), ratio(sn.DBQueries, sn.Invalidations))
	}
	return out + alternated(rows)
}

// alternated compares each path's requests with the naive path's in the
// same round, the two run back to back, and gives the median ratio.
func alternated(rows []result) string {
	var out string
	for _, n := range rows {
		if n.Path != "naive" || len(n.Slices) < 2 {
			continue
		}
		for _, r := range rows {
			if r.Scenario != n.Scenario || r.Path == "naive" || len(r.Slices) != len(n.Slices) {
				continue
			}
			var ratios []float64
			var each []string
			for i := range n.Slices {
				if n.Slices[i] > 0 {
					v := float64(r.Slices[i]) / float64(n.Slices[i])
					ratios = append(ratios, v)
					each = append(each, fmt.Sprintf("%.2f×", v))
				}
			}
			out += fmt.Sprintf("%s %s: %.2f× the naive path's requests (median of %d alternated rounds: %s; load %s)\n",
				r.Scenario, r.Path, median(ratios), len(ratios), strings.Join(each, " "), load(median([]float64{n.Load, r.Load})))
		}
	}
	return out
}

// nameList parses a comma-separated flag whose names must be among
// known: empty means all of them.
func nameList(flag, what, value string, known []string) ([]string, error) {
	if value == "" {
		return nil, nil
	}
	var out []string
	for name := range strings.SplitSeq(value, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("-%s: unknown %s %q (%s)", flag, what, name, strings.Join(known, ", "))
		}
		out = append(out, name)
	}
	return out, nil
}

// redisFromEnv connects to REDIS_URL, or starts a private redis-server.
func redisFromEnv(ctx context.Context, stdout io.Writer) (*redis.Options, func(), error) {
	if u := os.Getenv("REDIS_URL"); u != "" {
		o, err := redis.ParseURL(u)
		if err != nil {
			return nil, nil, err
		}
		return readme(o), func() {}, nil
	}
	port, err := redisserver.FreePort(false)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintln(stdout, "starting a private redis-server (REDIS_URL unset)")
	srv, err := redisserver.Start(ctx, &redisserver.Options{Port: port})
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(stdout, "redis-server running (pid %d) on %s\n", srv.PID(), srv.Addr)
	return readme(srv.Options()), func() { _ = srv.Stop() }, nil
}

// readme sets o up as README's client (its example's redis.Options):
// deadlines that hold when Redis stalls, no dial retries, and no retries
// (the guard loads through instead).
func readme(o *redis.Options) *redis.Options {
	o.ContextTimeoutEnabled, o.DialerRetries, o.MaxRetries = true, 1, -1
	return o
}

func redact(dsn string) string {
	if i := len("postgres://"); len(dsn) > i && dsn[:i] == "postgres://" {
		return "postgres://…"
	}
	return dsn
}
