// Command cacheguard-pgfollow runs a PostgreSQL follower (package pgfollow)
// as a sidecar: every committed change of the named tables becomes the
// writes of their Guards in Redis, whoever wrote it.
//
//	cacheguard-pgfollow -table products=product -table users=user:email -create
//
// Run it with -h for what PostgreSQL needs. SIGINT or SIGTERM stops it; the
// slot keeps its position for the next run (or for a standby started with
// the same flags, which takes over when this one ends).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/follow/postgres/followprometheus"
	"github.com/cacheguard/cacheguard/guard"
)

const usage = `usage: cacheguard-pgfollow [flags] -table TABLE=GUARD[:KEY] ...

Follows a logical replication slot of PostgreSQL and turns each committed
row change of TABLE into the writes of the Guard GUARD (under -prefix), by
the column KEY (default: the table's one-column primary key): INSERT → Add,
UPDATE → Invalidate (a changed key: Invalidate of the old, Add of the new),
DELETE → Invalidate, TRUNCATE → every entry dropped and the filter rebuilt from
SELECT KEY FROM TABLE. The slot's position advances only after the writes
landed in Redis: a follower that dies resumes where it left off.

PostgreSQL needs:
  wal_level = logical          (postgresql.conf, or ALTER SYSTEM; then restart)
  a role with REPLICATION      (ALTER ROLE <role> REPLICATION), owning the tables or superuser for -create
  each KEY in the table's replica identity: the primary key by default,
  or ALTER TABLE <table> REPLICA IDENTITY FULL (or USING INDEX)
  the publication and the slot: -create makes them (CREATE PUBLICATION, and a
  pgoutput slot)

The slot's cost: while no follower consumes it, the server keeps all WAL
written since, and its disk fills. The follower warns past -lag-warn; drop
the slot with -drop-slot if you stop following for good. With
max_slot_wal_keep_size set, PostgreSQL invalidates a slot that would keep
more: the changes since are lost, and the follower stops with an error
saying so. -recover then makes the slot anew, drops every entry of the
tables' Guards and rebuilds their filters, and follows.

The inspector samples the IDs written (-inspect-rate) and reads each back
from Redis at each of -inspect-delays after its write, as a Get elsewhere
would; it counts those found inconsistent with the table, per table and
delay (-metrics; -summary logs a line per delay, summed over the tables),
and -inspect-repair repairs them.

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}

// tablesFlag collects -table values.
type tablesFlag []string

func (t *tablesFlag) String() string     { return strings.Join(*t, ",") }
func (t *tablesFlag) Set(v string) error { *t = append(*t, v); return nil }

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cacheguard-pgfollow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	var tables tablesFlag
	fs.Var(&tables, "table", "TABLE=GUARD[:KEY], repeated")
	// Defaults from the environment are filled in after Parse, so that -h
	// neither prints them (a URL may hold a password) nor names two.
	pg := fs.String("pg", "", "PostgreSQL URL of a REPLICATION role (default $DATABASE_URL)")
	redisURL := fs.String("redis", "", "Redis URL (default $REDIS_URL, else redis://localhost:6379); the client is set up as "+
		"README's (context_timeout_enabled=true, dialer_retries=1, max_retries=-1), which the URL may override")
	cluster := fs.Bool("cluster", false, "Redis Cluster: -redis is a cluster URL, each node after the first in an addr= parameter "+
		"(redis://user:pass@host1:6379?addr=host2:6379&addr=host3:6379)")
	prefix := fs.String("prefix", "cg", "the Guards' KeyPrefix")
	slot := fs.String("slot", "cacheguard", "the replication slot")
	pub := fs.String("publication", "cacheguard", "the publication of the tables")
	create := fs.Bool("create", false, "create the publication (or add missing tables to it) and the slot, then follow")
	drop := fs.Bool("drop-slot", false, "drop the slot and exit (the server frees its WAL)")
	recoverSlot := fs.Bool("recover", false, "on a slot PostgreSQL invalidated (max_slot_wal_keep_size): make it anew, "+
		"drop the tables' entries and rebuild their filters, then follow")
	lagWarn := fs.Uint64("lag-warn", 64<<20, "warn while the follower lags by more bytes of WAL than this")
	metrics := fs.String("metrics", "", "serve Prometheus metrics on this address (e.g. :9187)")
	rate := fs.Float64("inspect-rate", 0.01, "share of the IDs written that the inspector reads back, at most 1; 0 or negative turns it off")
	delays := fs.String("inspect-delays", "1s,10s", "when the inspector reads each sampled ID back after its write, as comma-separated `durations`")
	repair := fs.Bool("inspect-repair", false, "repair each inconsistency the inspector finds (Invalidate, or Add to the filter)")
	summary := fs.Duration("summary", 0, "log the inspector's counts and the lag every interval (e.g. 1m; 0: never)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	inspect, err := inspectOptions(*rate, *delays, *repair)
	if err != nil {
		fmt.Fprintf(stderr, "cacheguard-pgfollow: %v\n", err)
		return 2
	}
	if *summary < 0 {
		fmt.Fprintf(stderr, "cacheguard-pgfollow: -summary %v: want 0 (never) or more\n", *summary)
		return 2
	}
	*pg = or(*pg, getenv("DATABASE_URL"))
	*redisURL = or(*redisURL, or(getenv("REDIS_URL"), "redis://localhost:6379"))
	log := slog.New(slog.NewTextHandler(stderr, nil))
	redis.SetLogger(guard.RedisLogger(log)) // go-redis's own lines: each kind once per 10 s, with a count
	fail := func(err error) int {
		log.Error("cacheguard-pgfollow: " + err.Error())
		return 1
	}
	if *pg == "" {
		fmt.Fprintln(stderr, "cacheguard-pgfollow: -pg or DATABASE_URL is required")
		return 2
	}
	if *drop {
		if err := pgfollow.DropSlot(ctx, *pg, *slot); err != nil {
			return fail(err)
		}
		log.Info("cacheguard-pgfollow: slot dropped", "slot", *slot)
		return 0
	}
	if len(tables) == 0 {
		fmt.Fprintln(stderr, "cacheguard-pgfollow: at least one -table TABLE=GUARD[:KEY] is required")
		return 2
	}
	rdb, err := redisClient(*redisURL, *cluster)
	if err != nil {
		fmt.Fprintf(stderr, "cacheguard-pgfollow: -redis: %v\n", err)
		return 2
	}
	defer rdb.Close()
	var specs []pgfollow.Table
	for _, t := range tables {
		name, rest, ok := strings.Cut(t, "=")
		gname, key, _ := strings.Cut(rest, ":")
		if !ok || name == "" || gname == "" {
			fmt.Fprintf(stderr, "cacheguard-pgfollow: -table %q: want TABLE=GUARD[:KEY]\n", t)
			return 2
		}
		g, err := guard.New(ctx, rdb, gname, &guard.Options{KeyPrefix: *prefix, Logger: log})
		if err != nil {
			return fail(err)
		}
		defer g.Close()
		specs = append(specs, pgfollow.Table{Name: name, Key: key, Guard: g})
	}
	opts := &pgfollow.Options{Slot: *slot, Publication: *pub, Logger: log, LagWarn: *lagWarn, Inspect: inspect}
	f, err := pgfollow.New(*pg, specs, opts) // checks the options before -create touches PostgreSQL
	if errors.Is(err, pgfollow.ErrOptions) {
		fmt.Fprintf(stderr, "cacheguard-pgfollow: %v\n", err)
		return 2
	} else if err != nil {
		return fail(err)
	}
	if *create {
		names := make([]string, len(specs))
		for i, s := range specs {
			names[i] = s.Name
		}
		if err := pgfollow.Setup(ctx, *pg, opts, names...); err != nil {
			return fail(err)
		}
	}
	if *metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(followprometheus.New(f))
		srv := &http.Server{Addr: *metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() { // run's: ended by the Shutdown below, which run waits for
			defer close(served)
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("cacheguard-pgfollow: metrics", "err", err)
			}
		}()
		defer func() {
			_ = srv.Shutdown(context.WithoutCancel(ctx))
			<-served
		}()
	}
	if *summary > 0 {
		sctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var delays []time.Duration // none: the inspector is off
		if inspect.Rate > 0 {
			delays = inspect.Delays
		}
		wg.Go(func() { summarize(sctx, log, f, *summary, delays) }) // run's: ended and waited for below
		defer func() {
			cancel()
			wg.Wait()
		}()
	}
	log.Info("cacheguard-pgfollow: following", "slot", *slot, "publication", *pub, "tables", len(specs))
	for {
		err := f.Run(ctx)
		switch {
		case errors.Is(err, pgfollow.ErrSlotLost) && *recoverSlot:
			log.Warn("cacheguard-pgfollow: recovering: the slot made anew, the tables' entries dropped and their filters rebuilt", "err", err)
			if err := f.Recover(ctx); err != nil {
				return fail(err)
			}
			continue
		case err != nil && !errors.Is(err, context.Canceled):
			return fail(err)
		}
		log.Info("cacheguard-pgfollow: stopped; the slot keeps its position for the next run", "slot", *slot)
		return 0
	}
}

// redisClient is the follower's client: one server, or with cluster a
// Redis Cluster, set up as README's client unless the URL says otherwise.
func redisClient(raw string, cluster bool) (redis.UniversalClient, error) {
	if !cluster {
		o, err := redisOptions(raw)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(o), nil
	}
	clean, ctxTimeouts, dialRetries, maxRetries, err := readmeParams(raw)
	if err != nil {
		return nil, err
	}
	o, err := redis.ParseClusterURL(clean)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled, o.DialerRetries = ctxTimeouts, dialRetries
	if maxRetries {
		o.MaxRetries = -1
	}
	return redis.NewClusterClient(o), nil
}

// redisOptions parses a Redis URL into README's client set-up
// (ContextTimeoutEnabled, DialerRetries 1, MaxRetries -1) unless the URL
// says otherwise: besides go-redis's parameters it takes
// context_timeout_enabled and dialer_retries, which redis.ParseURL refuses.
func redisOptions(raw string) (*redis.Options, error) {
	clean, ctxTimeouts, dialRetries, maxRetries, err := readmeParams(raw)
	if err != nil {
		return nil, err
	}
	o, err := redis.ParseURL(clean)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled, o.DialerRetries = ctxTimeouts, dialRetries
	if maxRetries {
		o.MaxRetries = -1
	}
	return o, nil
}

// readmeParams takes README's parameters out of raw: the URL left, and
// context_timeout_enabled, dialer_retries and whether max_retries is unset.
func readmeParams(raw string) (clean string, ctxTimeouts bool, dialRetries int, maxRetries bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, 0, false, err
	}
	q := u.Query()
	ctxTimeouts, dialRetries, maxRetries = true, 1, !q.Has("max_retries")
	if v, ok := q["context_timeout_enabled"]; ok {
		if ctxTimeouts, err = strconv.ParseBool(v[len(v)-1]); err != nil {
			return "", false, 0, false, fmt.Errorf("context_timeout_enabled: %w", err)
		}
		q.Del("context_timeout_enabled")
	}
	if v, ok := q["dialer_retries"]; ok {
		if dialRetries, err = strconv.Atoi(v[len(v)-1]); err != nil {
			return "", false, 0, false, fmt.Errorf("dialer_retries: %w", err)
		}
		q.Del("dialer_retries")
	}
	u.RawQuery = q.Encode()
	return u.String(), ctxTimeouts, dialRetries, maxRetries, nil
}

// inspectOptions checks the -inspect flags: pgfollow.Inspect, whose Rate 0
// would be the default (1%), so that -inspect-rate 0 turns it off.
func inspectOptions(rate float64, delays string, repair bool) (pgfollow.Inspect, error) {
	in := pgfollow.Inspect{Rate: rate, Repair: repair}
	if !(rate <= 1) {
		return in, fmt.Errorf("-inspect-rate %v: want at most 1 (0 or negative: off)", rate)
	}
	if rate <= 0 {
		in.Rate = -1
	}
	for _, d := range strings.Split(delays, ",") {
		v, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil {
			return in, fmt.Errorf("-inspect-delays %q: %v", delays, err)
		}
		if v <= 0 {
			return in, fmt.Errorf("-inspect-delays %q: %v: want each above 0", delays, v)
		}
		in.Delays = append(in.Delays, v)
	}
	return in, nil
}

// summarize logs the inspector's counts and the lag every interval until
// ctx ends: a line per delay of delays, its counts summed over the tables
// (as sum by (delay) over -metrics' series; each ID is read back once per
// delay), or one line with no delay if there is none (the inspector off).
// Each line has the counts since the start and in its window (since the
// line before), the nines once an inconsistency was found (before, the
// bound the checks show: nines_at_least, none before any check), and the
// last IDs found inconsistent at that delay in the window, by table.
func summarize(ctx context.Context, log *slog.Logger, f *pgfollow.Follower, every time.Duration, delays []time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := map[time.Duration]pgfollow.Inspection{} // the sums at the line before, by delay
	seen := map[string]uint64{}                     // inconsistencies at the line before, by table and delay
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st := f.Stats()
		sums := map[time.Duration]pgfollow.Inspection{}
		for _, d := range delays { // a line for each before its first check too
			sums[d] = pgfollow.Inspection{}
		}
		recent := map[time.Duration][]string{}
		for _, in := range st.Inspections {
			sum := sums[in.Delay]
			sum.Checked, sum.Inconsistent, sum.Repaired = sum.Checked+in.Checked, sum.Inconsistent+in.Inconsistent, sum.Repaired+in.Repaired
			sums[in.Delay] = sum
			key := in.Table + " " + in.Delay.String()
			for _, id := range in.Recent[max(0, len(in.Recent)-int(in.Inconsistent-seen[key])):] {
				recent[in.Delay] = append(recent[in.Delay], in.Table+":"+id)
			}
			seen[key] = in.Inconsistent
		}
		if len(sums) == 0 { // the inspector is off
			log.Info("cacheguard-pgfollow: inspector", inspectorAttrs(pgfollow.Inspection{}, pgfollow.Inspection{}, nil, st.LagBytes)...)
			continue
		}
		for _, d := range slices.Sorted(maps.Keys(sums)) {
			attrs := append([]any{"delay", d.String()}, inspectorAttrs(sums[d], last[d], recent[d], st.LagBytes)...)
			log.Info("cacheguard-pgfollow: inspector", attrs...)
		}
		last = sums
	}
}

// inspectorAttrs are the attributes of a summary line: the counts of sum,
// those since last, the nines (or their bound), the recent inconsistent IDs
// and the lag.
func inspectorAttrs(sum, last pgfollow.Inspection, recent []string, lag uint64) []any {
	attrs := []any{"checked", sum.Checked, "inconsistent", sum.Inconsistent, "repaired", sum.Repaired,
		"window_checked", sum.Checked - last.Checked, "window_inconsistent", sum.Inconsistent - last.Inconsistent}
	switch {
	case sum.Inconsistent > 0:
		attrs = append(attrs, "nines", math.Round(sum.Nines()*100)/100)
	case sum.Checked > 0:
		attrs = append(attrs, "nines_at_least", math.Round(sum.AtLeast()*100)/100)
	}
	if len(recent) > 0 {
		attrs = append(attrs, "recent_inconsistent", strings.Join(recent, ","))
	}
	return append(attrs, "lag_bytes", lag)
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
