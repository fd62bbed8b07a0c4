package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// The faults, each drawn once per round of the schedule, in an order the
// seed shuffles.
var faultKinds = []string{
	"redis SIGKILL, empty restart",
	"redis restart from an older dump",
	"redis SIGSTOP",
	"FLUSHALL",
	"eviction burst",
	"service SIGKILL and restart",
	"follower SIGKILL, standby takes over",
	"PostgreSQL fast restart",
	"filter rebuild by the command",
}

// clusterFaultKinds are the cluster variant's: a whole-server restart has
// no meaning there; a master failover and a slot migration do. The faults
// after the first three are the same.
var clusterFaultKinds = append([]string{
	"master SIGKILL, its replica takes over",
	"slot migration",
	"master SIGSTOP",
}, faultKinds[3:]...)

// planned is one fault of the schedule.
type planned struct {
	kind   string
	gap    time.Duration // the pause before it, after the last fault's return to normal
	hold   time.Duration // how long it lasts (a freeze, a dump's age, an eviction burst, a process down)
	target int           // which service
}

// schedule is the first n faults of seed's schedule of kinds: the same for
// the same seed.
func schedule(seed uint64, n int, kinds []string) []planned {
	r := rand.New(rand.NewPCG(seed, 0x6368616f73))
	var plan []planned
	for len(plan) < n {
		for _, i := range r.Perm(len(kinds)) {
			plan = append(plan, planned{kind: kinds[i], gap: time.Second + time.Duration(r.Int64N(int64(2*time.Second))),
				hold: time.Second + time.Duration(r.Int64N(int64(4*time.Second))), target: r.IntN(3)})
		}
	}
	return plan[:n]
}

type result struct {
	cfg        config
	check      Report
	faults     []Fault
	inspection inspection
	byVia      map[string]int
	writes     map[string]int // by process kind
	kinds      []string       // the variant's faults
	ran        time.Duration
}

func (d *deployment) run(ctx context.Context) *result {
	t := d.t
	mctx, stopMonitor := context.WithCancel(ctx)
	var monitors sync.WaitGroup
	d.monitor(mctx, &monitors)
	d.waitFor(ctx, "the filter built by a service's ID source", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		n := len(d.timeline.Samples)
		return n > 0 && d.timeline.Samples[n-1].Ready
	})
	began := time.Now()
	wctx, stopWriter := context.WithCancel(ctx)
	sql, err := NewRecorder(d.history("sql"), "sql")
	if err != nil {
		t.Fatal(err)
	}
	var writer sync.WaitGroup
	writer.Go(func() { d.writeSQL(wctx, sql, rand.New(rand.NewPCG(d.cfg.seed, 1))) })
	plan := schedule(d.cfg.seed, 1000, d.kinds())
	deadline := began.Add(d.cfg.duration)
	for _, p := range plan {
		if time.Until(deadline) < p.gap+p.hold {
			break
		}
		time.Sleep(p.gap) // the schedule's pause between faults
		f := d.inject(ctx, p)
		lsn, err := walPosition(ctx, d.pool)
		if err != nil {
			t.Logf("chaos: the WAL position after %s: %v", f.Kind, err)
		}
		f.Normal = d.normal(ctx, f.End, lsn, time.Minute)
		d.mu.Lock()
		for _, s := range d.timeline.Samples {
			if s.At > f.End && s.Up && s.Ready {
				f.Ready = s.At
				break
			}
		}
		d.mu.Unlock()
		t.Logf("chaos: %s at %s, %v, normal %v after %s", f.Kind, at(f.Start), time.Duration(f.End-f.Start).Round(time.Millisecond),
			time.Duration(f.Normal-f.End).Round(time.Millisecond), f.Note)
		d.mu.Lock()
		d.timeline.Faults = append(d.timeline.Faults, f)
		d.mu.Unlock()
	}
	time.Sleep(time.Until(deadline)) // the run's length
	stopWriter()
	writer.Wait()
	_ = sql.Close()
	for _, p := range d.services {
		p.stop()
	}
	for _, p := range d.followers {
		p.stop()
	}
	stopMonitor()
	monitors.Wait()

	res := &result{cfg: d.cfg, ran: time.Since(began), byVia: map[string]int{}, writes: map[string]int{}, kinds: d.kinds()}
	files, _ := filepath.Glob(filepath.Join(d.dir, "history", "*.jsonl"))
	var history []Op
	for _, f := range files {
		ops, err := ReadHistory(f)
		if err != nil {
			t.Fatal(err)
		}
		history = append(history, ops...)
	}
	for _, o := range history {
		switch {
		case o.Kind == Read:
			res.byVia[o.Via]++
		case o.Kind == Write && o.Ver != 0:
			res.writes[strings.SplitN(o.Proc, ".", 2)[0]]++
		}
	}
	d.mu.Lock()
	tl := d.timeline
	d.mu.Unlock()
	res.faults = tl.Faults
	if b, err := json.Marshal(tl); err == nil { // for checking the histories again (ReadTimeline)
		_ = os.WriteFile(filepath.Join(d.dir, "timeline.json"), b, 0o644)
	}
	res.check = Check(history, tl, Rules{
		Local:        func(proc string) bool { return strings.HasPrefix(proc, "s0.") },
		LocalWindow:  time.Second, // LocalOptions' default TTL
		RepairWindow: time.Second,
		Reaction:     reaction,
	})
	res.inspection = d.inspector()
	return res
}

// kinds are the faults of the deployment's variant.
func (d *deployment) kinds() []string {
	if d.cfg.cluster {
		return clusterFaultKinds
	}
	return faultKinds
}

// inject runs fault p.
func (d *deployment) inject(ctx context.Context, p planned) Fault {
	t := d.t
	f := Fault{Kind: p.kind, Start: time.Now().UnixNano()}
	switch p.kind {
	case "redis SIGKILL, empty restart":
		f.Redis = true
		if err := d.redis.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove(filepath.Join(d.redis.Dir, "dump.rdb"))
		if err := d.redis.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	case "redis restart from an older dump":
		f.Redis = true
		f.Dump = time.Now().UnixNano()
		if err := d.admin.Save(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(p.hold) // the dump's age: writes go on
		f.Start = time.Now().UnixNano()
		if err := d.redis.Restart(ctx); err != nil { // SIGKILL, then a start that loads the dump
			t.Fatal(err)
		}
		_ = os.Remove(filepath.Join(d.redis.Dir, "dump.rdb"))
	case "redis SIGSTOP":
		f.Redis = true
		pid := d.redis.PID()
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		time.Sleep(p.hold) // frozen for this long
		_ = syscall.Kill(pid, syscall.SIGCONT)
	case "FLUSHALL":
		f.Redis = true
		if err := eachMaster(ctx, d.admin, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() }); err != nil {
			t.Fatal(err)
		}
	case "eviction burst":
		f.Redis = true
		if err := eachMaster(ctx, d.admin, func(ctx context.Context, c *redis.Client) error {
			info, err := c.InfoMap(ctx, "memory").Result()
			if err != nil {
				return err
			}
			mem, _ := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
			if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
				return err
			}
			return c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(mem*3/4, 10)).Err()
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(p.hold) // every write meanwhile evicts
		_ = eachMaster(ctx, d.admin, func(ctx context.Context, c *redis.Client) error {
			_ = c.ConfigSet(ctx, "maxmemory", "0").Err()
			return c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()
		})
	case "master SIGKILL, its replica takes over":
		f.Redis = true
		m := d.master(ctx, p.target)
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := d.cluster.WaitHealthy(ctx, time.Minute); err != nil { // its replica promoted
			t.Fatal(err)
		}
		if err := m.Restart(ctx); err != nil { // back as a replica
			t.Fatal(err)
		}
		if err := d.cluster.WaitHealthy(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
	case "master SIGSTOP":
		f.Redis = true
		m := d.master(ctx, p.target)
		_ = syscall.Kill(m.PID(), syscall.SIGSTOP)
		time.Sleep(p.hold) // frozen this long: past the node timeout (2 s) its replica takes over
		_ = syscall.Kill(m.PID(), syscall.SIGCONT)
		if err := d.cluster.WaitHealthy(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
	case "slot migration":
		d.migrate(ctx, p.target)
	case "service SIGKILL and restart":
		d.services[p.target].kill()
		time.Sleep(p.hold / 4) // down for this long
		d.services[p.target] = d.service(p.target, []string{"local", "http", "refresh"}[p.target])
	case "follower SIGKILL, standby takes over":
		d.followers[0].kill()
		d.followers = append(d.followers[1:], d.follower(false))
	case "PostgreSQL fast restart":
		f.Database = true
		if err := d.pg.Restart(); err != nil {
			t.Fatal(err)
		}
	case "filter rebuild by the command":
		// As docs/operations.md gives it: the query runs once the rebuild began.
		query := fmt.Sprintf("psql '%s' -At -c 'SELECT id FROM items'", d.pg.URL("postgres"))
		args := []string{"-prefix", prefix, "-name", "item", "-exec", query, "rebuild"}
		if d.cfg.cluster {
			args = append([]string{"-cluster"}, args...)
		}
		cmd := exec.CommandContext(ctx, filepath.Join(d.dir, "bin", "cacheguard"), args...)
		cmd.Env = append(os.Environ(), "REDIS_URL="+d.url("ops"))
		out, err := cmd.CombinedOutput()
		switch {
		case err != nil && strings.Contains(string(out), "far fewer IDs"):
			// Taken while a TRUNCATE's refill had not committed: refused,
			// and the filter keeps its generation, as operations.md says.
			f.Note = "refused: " + strings.TrimSpace(string(out))
		case err != nil:
			t.Fatalf("cacheguard rebuild: %v\n%s", err, out)
		}
	}
	f.End = time.Now().UnixNano()
	return f
}

// master is one of the cluster's current masters, by i.
func (d *deployment) master(ctx context.Context, i int) *redisserver.Server {
	ms, err := d.cluster.Masters(ctx)
	if err != nil || len(ms) == 0 {
		d.t.Fatalf("the cluster's masters: %v", err)
	}
	return ms[i%len(ms)]
}

// migrate moves 200 slots from master i to the next one, keys and all, with
// redis-cli --cluster reshard (MIGRATE, and ASK redirections meanwhile).
func (d *deployment) migrate(ctx context.Context, i int) {
	ms, err := d.cluster.Masters(ctx)
	if err != nil || len(ms) < 2 {
		d.t.Fatalf("the cluster's masters: %v", err)
	}
	from, to := ms[i%len(ms)], ms[(i+1)%len(ms)]
	id := func(s *redisserver.Server) string {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer c.Close()
		v, err := c.ClusterMyID(ctx).Result()
		if err != nil {
			d.t.Fatal(err)
		}
		return v
	}
	out, err := exec.CommandContext(ctx, "redis-cli", "--cluster", "reshard", from.Addr, "--cluster-from", id(from), "--cluster-to", id(to),
		"--cluster-slots", "200", "--cluster-yes").CombinedOutput()
	if err != nil {
		d.t.Fatalf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
}

// writeSQL is the writer outside the service: SQL on PostgreSQL that only
// the follower reports to the Guards. It owns the IDs "i<n>" with n%4 == 3
// and "o<k>"; now and then it TRUNCATEs the table and inserts the seeded
// rows again.
func (d *deployment) writeSQL(ctx context.Context, rec *Recorder, r *rand.Rand) {
	lastTruncate := time.Now()
	for ctx.Err() == nil {
		time.Sleep(writePace) // the load: a pace
		if time.Since(lastTruncate) > 40*time.Second {
			lastTruncate = time.Now()
			d.truncate(ctx, rec)
			continue
		}
		var id, sql string
		exists := true
		switch n := r.IntN(10); {
		case n < 4:
			id, sql = "i"+strconv.Itoa(r.IntN(seeded/sqlWriters)*sqlWriters+3), "UPDATE items SET v = nextval('ver') WHERE id = $1 RETURNING v"
		case n < 5:
			id, sql = "o"+strconv.Itoa(r.IntN(spread)), "UPDATE items SET v = nextval('ver') WHERE id = $1 RETURNING v"
		case n < 7:
			id, sql = "o"+strconv.Itoa(r.IntN(spread)), "INSERT INTO items VALUES ($1, nextval('ver')) ON CONFLICT DO NOTHING RETURNING v"
		case n < 8:
			id, sql, exists = "o"+strconv.Itoa(r.IntN(spread)), "WITH d AS (DELETE FROM items WHERE id = $1 RETURNING 1) SELECT nextval('ver') FROM d", false
		case n < 9:
			id, sql = "i"+strconv.Itoa(r.IntN(seeded/sqlWriters)*sqlWriters+3), "INSERT INTO items VALUES ($1, nextval('ver')) ON CONFLICT DO NOTHING RETURNING v"
		default: // a key change: the old ID goes, the new one comes
			d.rekey(ctx, rec, "o"+strconv.Itoa(r.IntN(spread)), "o"+strconv.Itoa(r.IntN(spread)))
			continue
		}
		start := time.Now().UnixNano()
		rec.Record(Op{Kind: Intent, ID: id, Start: start})
		var ver int64
		err := d.pool.QueryRow(ctx, sql, id).Scan(&ver)
		if !settled(err) {
			continue // the outcome is unknown: the Intent stays open
		}
		o := Op{Kind: Write, ID: id, Ver: ver, Exists: exists, Start: start, Err: Outside}
		if err == nil {
			o.LSN, _ = walPosition(ctx, d.pool)
		}
		o.End = time.Now().UnixNano()
		rec.Record(o)
	}
}

// settled reports whether a write's outcome is known: it committed (nil),
// changed nothing (no row), or PostgreSQL refused it.
func settled(err error) bool {
	var pe *pgconn.PgError
	return err == nil || errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pe)
}

// rekey changes the key of row from to to: a delete of from and a create
// of to, one version.
func (d *deployment) rekey(ctx context.Context, rec *Recorder, from, to string) {
	start := time.Now().UnixNano()
	rec.Record(Op{Kind: Intent, ID: from, Start: start})
	rec.Record(Op{Kind: Intent, ID: to, Start: start})
	var ver int64
	err := d.pool.QueryRow(ctx, "UPDATE items SET id = $2, v = nextval('ver') WHERE id = $1 RETURNING v", from, to).Scan(&ver)
	if !settled(err) {
		return
	}
	var lsn uint64
	if err == nil {
		lsn, _ = walPosition(ctx, d.pool)
	} else {
		ver = 0 // refused, or no such row: a write of nothing
	}
	end := time.Now().UnixNano()
	rec.Record(Op{Kind: Write, ID: from, Ver: ver, Start: start, End: end, LSN: lsn, Err: Outside})
	rec.Record(Op{Kind: Write, ID: to, Ver: ver, Exists: true, Start: start, End: end, LSN: lsn, Err: Outside})
}

// truncate empties the table (one version for every ID), then inserts the
// seeded rows again.
func (d *deployment) truncate(ctx context.Context, rec *Recorder) {
	start := time.Now().UnixNano()
	rec.Record(Op{Kind: Intent, ID: AllIDs, Start: start})
	var ver int64
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "TRUNCATE items"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT nextval('ver')").Scan(&ver)
	})
	if err != nil {
		return
	}
	lsn, _ := walPosition(ctx, d.pool)
	rec.Record(Op{Kind: Write, ID: AllIDs, Ver: ver, Start: start, End: time.Now().UnixNano(), LSN: lsn, Err: Outside})
	time.Sleep(200 * time.Millisecond) // the table stays empty a while: reads find it so
	_ = d.seedRows(ctx, rec)
}

// reaction is how soon after Redis answers again, its filter ready, the
// Guards are back on it (503s before then are counted apart): their
// circuit breakers probe every 100 ms, and a go-redis client whose pool
// failed PoolSize dials in a row dials again once a second only (its own
// dial breaker, internal/pool's tryDial): seed 2 saw a service's 503s end
// 0.9 s after Redis answered, its writes failing with "connection
// refused" meanwhile.
const reaction = 1100 * time.Millisecond

// markdown is the report.
func (r *result) markdown() string {
	var b strings.Builder
	c := r.check
	fmt.Fprintf(&b, "# Chaos run: seed %d, %v\n\n", r.cfg.seed, r.cfg.duration)
	fmt.Fprintf(&b, "`cd chaos && CHAOS_SEED=%d CHAOS_DURATION=%v go test -run TestChaos -v` (make chaos SEED=%d DURATION=%v), %s",
		r.cfg.seed, r.cfg.duration, r.cfg.seed, r.cfg.duration, time.Now().UTC().Format("2006-01-02"))
	if r.cfg.control != "" {
		fmt.Fprintf(&b, ", control run %s (the services commit their writes and do not tell the Guard)", r.cfg.control)
	}
	b.WriteString(".\n\n")
	vias := slices.Sorted(func(yield func(string) bool) {
		for k := range r.byVia {
			if !yield(k) {
				return
			}
		}
	})
	var reads []string
	for _, v := range vias {
		reads = append(reads, fmt.Sprintf("%d through %s", r.byVia[v], v))
	}
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| reads checked | %d (%s) |\n", c.Reads, strings.Join(reads, ", "))
	fmt.Fprintf(&b, "| writes | %d: services %d, SQL %d (%d whose process died or whose commit's outcome is unknown) |\n",
		c.Writes, r.writes["s0"]+r.writes["s1"]+r.writes["s2"], r.writes["sql"], c.Unresolved)
	fmt.Fprintf(&b, "| violations | %d: %s %d, %s %d, %s %d |\n", c.Violated(), StaleValue, c.Violations[StaleValue],
		ValueOfGone, c.Violations[ValueOfGone], FalseNotFound, c.Violations[FalseNotFound])
	fmt.Fprintf(&b, "| allowed by a documented window | %d in the Local copy's (1 s), %d in a rollback's repair (1 s after Redis answers) |\n",
		c.InLocalWindow, c.InRepairWindow)
	in := r.inspection
	fmt.Fprintf(&b, "| the follower's inspector | %d checked at 1 s, %d inconsistent, %d of them counted in a second no fault "+
		"or its recovery overlapped (the last named: %s) |\n", in.checked, in.inconsistent, in.calm(r.faults), strings.Join(in.recent, " "))
	fmt.Fprintf(&b, "| 503s | %d: %d while Redis answered and its filter was ready, %d within %v of Redis answering again, its filter ready "+
		"(the clients' and the Guards' circuit breakers probing), the rest while Redis did not answer or its filter was not ready |\n",
		c.Unavailable, c.UnavailableRedisUp, c.Reacting, reaction)
	fmt.Fprintf(&b, "| other failed reads | %d, %d of them while PostgreSQL restarted |\n", c.Failed, c.FailedDatabase)
	fmt.Fprintf(&b, "| loads of IDs that never existed | %d |\n", c.UnknownLoads)
	fmt.Fprintf(&b, "| longest a write took to take effect | %v |\n\n", c.LongestEffect.Round(time.Millisecond))
	b.WriteString("| fault | times | slowest return to normal |\n|---|---|---|\n")
	for _, k := range r.kinds {
		n, slowest := 0, time.Duration(0)
		for _, f := range r.faults {
			if f.Kind == k {
				n++
				if f.Normal == 0 {
					slowest = -1
				} else if slowest >= 0 {
					slowest = max(slowest, time.Duration(f.Normal-f.End))
				}
			}
		}
		s := slowest.Round(time.Millisecond).String()
		if slowest < 0 {
			s = "not within a minute"
		}
		fmt.Fprintf(&b, "| %s | %d | %s |\n", k, n, s)
	}
	if len(c.Examples) > 0 {
		b.WriteString("\nExamples:\n\n")
		for _, e := range c.Examples {
			b.WriteString("- " + e + "\n")
		}
	}
	b.WriteString("\n" + r.line())
	return b.String()
}
