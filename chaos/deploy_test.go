package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/pgserver"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// The deployment: one redis-server whose users are docs/usage.md's
// (app for the services, pgfollow for the follower, ops for the command),
// one PostgreSQL with the table items (id, v) and the sequence ver, the
// follower and a standby (cacheguard-pgfollow, inspecting every write), the
// three services, and the command for rebuilds.
type deployment struct {
	t    *testing.T
	cfg  config
	dir  string // histories, logs, binaries
	keep bool   // keep dir: the run failed

	redis   *redisserver.Server   // one server, or
	cluster *redisserver.Cluster  // 3 masters and 3 replicas
	admin   redis.UniversalClient // the default user: the faults' hand
	pg      *pgserver.Server
	pool    *pgxpool.Pool
	url     func(user string) string // the Redis URL of a user

	mu        sync.Mutex // guards services, followers, incarnation and timeline
	services  []*process
	followers []*process // the active one first, then the standby
	count     map[string]int
	timeline  Timeline
}

const prefix = "chaos"

func deploy(ctx context.Context, t *testing.T, cfg config) *deployment {
	t.Helper()
	dir, err := os.MkdirTemp("", "cg-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	d := &deployment{t: t, cfg: cfg, dir: dir, count: map[string]int{}}
	t.Cleanup(func() {
		if !d.keep && !t.Failed() {
			_ = os.RemoveAll(dir)
		}
	})
	for _, sub := range []string{"bin", "history", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The follower and the command, as a team deploys them.
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "bin")+"/",
		"github.com/cacheguard/cacheguard/cmd/cacheguard", "github.com/cacheguard/cacheguard/follow/postgres/cmd/cacheguard-pgfollow")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var args []string
	for user, cmds := range map[string]string{"app": keyspace.ACLService, "pgfollow": keyspace.ACLFollower, "ops": keyspace.ACLCommand} {
		if cfg.cluster {
			cmds += " " + keyspace.ACLCluster
		}
		args = append(append(args, "--user", user, "on", ">secret"), keyspace.ACLRule(prefix, cmds)...)
	}
	if cfg.cluster {
		cl, err := redisserver.StartCluster(ctx, 3, 1, args...)
		if err != nil {
			t.Fatal(err)
		}
		d.cluster = cl
		t.Cleanup(cl.Stop)
		addrs := cl.Addrs()
		d.url = func(user string) string {
			return fmt.Sprintf("redis://%s:secret@%s?addr=%s", user, addrs[0], strings.Join(addrs[1:], "&addr="))
		}
		d.admin = redis.NewClusterClient(cl.Options())
	} else {
		port, err := redisserver.FreePort(false)
		if err != nil {
			t.Fatal(err)
		}
		if d.redis, err = redisserver.Start(ctx, &redisserver.Options{Port: port, Args: args}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.redis.Stop() })
		d.url = func(user string) string { return fmt.Sprintf("redis://%s:secret@%s", user, d.redis.Addr) }
		d.admin = redis.NewClient(&redis.Options{Addr: d.redis.Addr, MaxRetries: -1})
	}
	t.Cleanup(func() { _ = d.admin.Close() })

	d.pg, err = pgserver.Start("wal_level=logical", "max_wal_senders=10", "max_replication_slots=10")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pg.Remove)
	d.pool, err = pgxpool.New(ctx, d.pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pool.Close)
	if _, err := d.pool.Exec(ctx, "CREATE SEQUENCE ver; CREATE TABLE items (id text PRIMARY KEY, v bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	seed, err := NewRecorder(d.history("seed"), "seed")
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	if err := d.seedRows(ctx, seed); err != nil {
		t.Fatal(err)
	}
	d.followers = []*process{d.follower(true)}
	d.waitFor(ctx, "the follower's slot", func() bool {
		var n int
		_ = d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cacheguard' AND active").Scan(&n)
		return n == 1
	})
	d.followers = append(d.followers, d.follower(false))
	for slot, kind := range []string{"local", "http", "refresh"} {
		d.services = append(d.services, d.service(slot, kind))
	}
	return d
}

// seedRows inserts the rows "i0".."i1999" that are missing, each a write.
func (d *deployment) seedRows(ctx context.Context, rec *Recorder) error {
	start := time.Now().UnixNano()
	rows, err := d.pool.Query(ctx, "INSERT INTO items SELECT 'i' || g, nextval('ver') FROM generate_series(0, $1) g "+
		"ON CONFLICT DO NOTHING RETURNING id, v", seeded-1)
	if err != nil {
		return err
	}
	var ops []Op
	for rows.Next() {
		o := Op{Kind: Write, Exists: true, Start: start, Err: Outside}
		if err := rows.Scan(&o.ID, &o.Ver); err != nil {
			return err
		}
		ops = append(ops, o)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	lsn, err := walPosition(ctx, d.pool)
	if err != nil {
		return err
	}
	end := time.Now().UnixNano()
	for _, o := range ops {
		o.End, o.LSN = end, lsn
		if rec.proc == "seed" {
			o.Err = "" // the start: in effect before any reader runs
		}
		rec.Record(o)
	}
	return nil
}

func (d *deployment) history(proc string) string {
	return filepath.Join(d.dir, "history", proc+".jsonl")
}

// process is one OS process of the deployment.
type process struct {
	name string // its role and incarnation, "s0.2"
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs bin with args and env, its output to a log of its own.
func (d *deployment) start(role, bin string, args, env []string) *process {
	d.mu.Lock()
	d.count[role]++
	name := role + "." + strconv.Itoa(d.count[role])
	d.mu.Unlock()
	p := &process{name: name, log: filepath.Join(d.dir, "log", name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		d.t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	go func() { // the process's: ends when it exits, which stop and kill wait for
		_ = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p
}

// kill SIGKILLs p and waits for it.
func (p *process) kill() { p.signal(syscall.SIGKILL) }

// stop ends p with SIGTERM (SIGKILL after 20 s) and waits for it.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

func (p *process) signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	<-p.done
}

// service starts the service process of slot.
func (d *deployment) service(slot int, kind string) *process {
	role := "s" + strconv.Itoa(slot)
	d.mu.Lock()
	name := role + "." + strconv.Itoa(d.count[role]+1)
	d.mu.Unlock()
	return d.start(role, os.Args[0], []string{"-test.run=^$"}, []string{
		envRole + "=service", envKind + "=" + kind, envProc + "=" + name, envSlot + "=" + strconv.Itoa(slot),
		envHistory + "=" + d.history(name), envRedis + "=" + d.url("app"), envPG + "=" + d.pg.URL("postgres"),
		envControl + "=" + d.cfg.control, envCluster + "=" + d.clusterFlag(),
	})
}

// follower starts cacheguard-pgfollow as docs/follow.md runs it, the
// inspector reading back every write at 1 s and logging its counts every
// second; the first creates the publication and the slot.
func (d *deployment) follower(create bool) *process {
	args := []string{"-pg", d.pg.URL("postgres"), "-redis", d.url("pgfollow"), "-prefix", prefix, "-table", "items=item",
		"-inspect-rate", "1", "-inspect-delays", "1s", "-summary", "1s"}
	if create {
		args = append(args, "-create")
	}
	if d.cfg.cluster {
		args = append(args, "-cluster")
	}
	return d.start("follower", filepath.Join(d.dir, "bin", "cacheguard-pgfollow"), args, nil)
}

// clusterFlag is CHAOS_CLUSTER's value for the services.
func (d *deployment) clusterFlag() string {
	if d.cfg.cluster {
		return "1"
	}
	return "0"
}

// eachMaster runs fn on every master of a cluster client, or on a client
// of one server.
func eachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, fn)
	}
	return fn(ctx, rdb.(*redis.Client))
}

// waitFor polls cond every 20 ms for at most a minute.
func (d *deployment) waitFor(ctx context.Context, what string, cond func() bool) {
	d.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.t.Fatalf("chaos: %s: not after a minute", what)
		}
		time.Sleep(20 * time.Millisecond) // polling a state the other processes set
	}
}

// monitor samples, until ctx ends, whether Redis answers the services' user
// and the filter is ready (every 50 ms), and the slot's confirmed position
// (every 20 ms).
func (d *deployment) monitor(ctx context.Context, wg *sync.WaitGroup) {
	rdb, err := client(d.url("app"), d.cfg.cluster)
	if err != nil {
		d.t.Fatal(err)
	}
	g, err := guard.New(ctx, rdb, "item", &guard.Options{KeyPrefix: prefix, Filter: guard.FilterOptions{ExpectedItems: 50_000}})
	if err != nil {
		d.t.Fatal(err)
	}
	wg.Go(func() {
		defer rdb.Close()
		defer g.Close()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			<-tick.C
			s := Sample{}
			sctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
			if err := eachMaster(sctx, rdb, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
				s.Unreachable = err.Error()
			} else if info, err := g.Info(sctx); err != nil {
				s.Up, s.Unreachable = true, err.Error()
			} else {
				s.Up, s.Ready = true, info.Ready
			}
			cancel()
			s.At = time.Now().UnixNano()
			d.mu.Lock()
			d.timeline.Samples = append(d.timeline.Samples, s)
			d.mu.Unlock()
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var last uint64
		for ctx.Err() == nil {
			<-tick.C
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			var lsn int64
			err := d.pool.QueryRow(sctx, "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = 'cacheguard'").Scan(&lsn)
			cancel()
			if err != nil || uint64(lsn) <= last {
				continue
			}
			last = uint64(lsn)
			d.mu.Lock()
			d.timeline.Confirms = append(d.timeline.Confirms, Confirm{At: time.Now().UnixNano(), LSN: last})
			d.mu.Unlock()
		}
	})
}

// normal waits until the deployment is back to normal after a fault that
// ended at end with the WAL at lsn: a sample since end says Redis answers
// and the filter is ready, and the follower confirmed lsn. It returns when
// (0 if not within limit).
func (d *deployment) normal(ctx context.Context, end int64, lsn uint64, limit time.Duration) int64 {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		d.mu.Lock()
		var up, confirmed int64
		if n := len(d.timeline.Samples); n > 0 && d.timeline.Samples[n-1].At > end && d.timeline.Samples[n-1].Up && d.timeline.Samples[n-1].Ready {
			up = d.timeline.Samples[n-1].At
		}
		if n := len(d.timeline.Confirms); n > 0 && d.timeline.Confirms[n-1].LSN >= lsn {
			confirmed = d.timeline.Confirms[n-1].At
		}
		d.mu.Unlock()
		if up != 0 && confirmed != 0 {
			return max(up, confirmed)
		}
		time.Sleep(20 * time.Millisecond) // polling the monitor's samples
	}
	return 0
}

// inspection is what the followers' inspectors counted, and when.
type inspection struct {
	checked, inconsistent int
	recent                []string
	seconds               []counted // each summary line's last second
}

// counted is one summary line: the inconsistencies counted in the second
// before at.
type counted struct {
	at           int64
	inconsistent int
}

// inspector sums the follower processes' inspector counts (each one's last
// summary line) and keeps each line's count of its second.
func (d *deployment) inspector() inspection {
	var in inspection
	logs, _ := filepath.Glob(filepath.Join(d.dir, "log", "follower.*.log"))
	for _, path := range logs {
		b, _ := os.ReadFile(path)
		var last string
		for line := range strings.Lines(string(b)) {
			if !strings.Contains(line, "cacheguard-pgfollow: inspector") {
				continue
			}
			last = line
			if i := strings.Index(line, "recent_inconsistent="); i >= 0 {
				in.recent = append(in.recent, strings.Split(strings.Fields(line[i+len("recent_inconsistent="):])[0], ",")...)
			}
			ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				in.seconds = append(in.seconds, counted{at: at.UnixNano(), inconsistent: field(line, "window_inconsistent")})
			}
		}
		in.checked += field(last, "checked")
		in.inconsistent += field(last, "inconsistent")
	}
	return in
}

// calm is how many of the inspector's inconsistencies were counted in a
// second that no fault or its recovery (until the deployment was back to
// normal, the follower caught up, and a second more: the read-back's
// delay) overlapped.
func (in inspection) calm(faults []Fault) int {
	n := 0
	for _, s := range in.seconds {
		from := s.at - int64(time.Second)
		busy := false
		for _, f := range faults {
			end := max(f.End, f.Ready, f.Normal) + int64(2*time.Second)
			if f.Normal == 0 {
				end = never
			}
			if f.Start-int64(time.Second) <= s.at && end >= from {
				busy = true
			}
		}
		if !busy {
			n += s.inconsistent
		}
	}
	return n
}

// field is the number of name=N in a log line.
func field(line, name string) int {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
