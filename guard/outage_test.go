package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestLoadThroughWhenRedisIsDown: with Redis killed, Get answers from the
// loader (values right, unknown IDs ErrNotFound), merging concurrent callers
// of an ID into one load; the breaker opens, after which Gets do not ask
// Redis at all.
func TestLoadThroughWhenRedisIsDown(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, _, g := privateGuard(t, &guard.Options{})
	d := newDB(10)
	d.delay = 50 * time.Millisecond
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var wrong atomic.Int32
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if p, err := guard.Get(ctx, g, "p4", d.load); err != nil || p.Price != 4 {
				wrong.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if wrong.Load() != 0 {
		t.Fatalf("%d of 50 callers got no value or a wrong one", wrong.Load())
	}
	if n := d.calls.Load(); n > 3 { // one flight; a caller may run one more after an older flight
		t.Fatalf("%d loads for 50 concurrent callers of one ID", n)
	}
	// The filter's copy has never seen it: neither a load nor ErrNotFound.
	calls := d.calls.Load()
	if _, err := guard.Get(ctx, g, "nope", d.load); !errors.Is(err, guard.ErrUnconfirmed) || d.calls.Load() != calls {
		t.Fatalf("unknown ID during the outage: %v, %d loads", err, d.calls.Load()-calls)
	}
	for range 10 {
		_, _ = guard.Get(ctx, g, "p1", d.load)
	}
	st := g.Stats()
	if st.BreakerOpens == 0 || st.LoadThroughs == 0 {
		t.Fatalf("stats %+v", st)
	}
	errs := st.RedisErrors
	began := time.Now()
	for range 20 {
		if p, err := guard.Get(ctx, g, "p2", d.load); err != nil || p.Price != 2 {
			t.Fatalf("with the breaker open: %+v, %v", p, err)
		}
	}
	// The breaker lets one read probe Redis per 100 ms (breakFor); the 20
	// loads take about 1 s, longer on a busy machine: about 11 probes,
	// against 20 reads without it.
	probes := 1 + uint64(time.Since(began)/(100*time.Millisecond))
	if n := g.Stats().RedisErrors - errs; n > probes {
		t.Fatalf("%d Redis errors in %v while the breaker was open (at most %d probes): it did not keep Gets off Redis", n, time.Since(began), probes)
	}
}

// TestLoadThroughIsCapped: the loads that an outage sends to the source of
// truth are capped across IDs; the rest get ErrUnavailable at once.
func TestLoadThroughIsCapped(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	g, err := guard.New(ctx, rdb, "product", &guard.Options{Outage: &guard.OutageOptions{MaxLoads: 2}, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var inside, most atomic.Int32
	load := func(ctx context.Context, id string) (string, error) {
		n := inside.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		inside.Add(-1)
		return "v" + id, nil
	}
	var wg sync.WaitGroup
	var served, shed atomic.Int32
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := guard.Get(ctx, g, fmt.Sprint(i), load)
			switch {
			case err == nil && v == "v"+fmt.Sprint(i):
				served.Add(1)
			case errors.Is(err, guard.ErrUnavailable):
				shed.Add(1)
			default:
				t.Errorf("%d: %q, %v", i, v, err)
			}
		}()
	}
	waitFor(t, func() bool { return g.Stats().Shed == 8 })
	close(release)
	wg.Wait()
	if most.Load() != 2 || served.Load() != 2 || shed.Load() != 8 {
		t.Fatalf("at most %d loads at once, %d served, %d shed; want 2, 2, 8", most.Load(), served.Load(), shed.Load())
	}
}

// TestLoadThroughWhenRedisRefusesWrites: under maxmemory with noeviction the
// lock cannot be taken; a known, uncached ID is served from the loader.
func TestLoadThroughWhenRedisRefusesWrites(t *testing.T) {
	ctx := context.Background()
	_, rdb, g := privateGuard(t, &guard.Options{})
	d := newDB(10)
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if p, err := guard.Get(ctx, g, "p3", d.load); err != nil || p.Price != 3 {
		t.Fatalf("known ID under maxmemory: %+v, %v", p, err)
	}
	if _, err := guard.Get(ctx, g, "unknown", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("unknown ID under maxmemory: %v (the filter still answers)", err)
	}
	if st := g.Stats(); st.LoadThroughs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestNewWithoutRedis: a Guard made while Redis is down serves through the
// loader, and starts caching by itself when Redis comes back.
func TestNewWithoutRedis(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	srv, rdb := redistest.Private(t)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	var logs redistest.Logs
	g, err := guard.New(ctx, rdb, "product", &guard.Options{
		Local:  &guard.LocalOptions{},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Filter: guard.FilterOptions{ExpectedItems: 1000},
	})
	if err != nil {
		t.Fatalf("New with Redis down: %v", err)
	}
	defer g.Close()
	d := newDB(10)
	if p, err := guard.Get(ctx, g, "p5", d.load); err != nil || p.Price != 5 {
		t.Fatalf("Get with Redis down: %+v, %v", p, err)
	}
	if !strings.Contains(logs.String(), "redis unavailable at New") {
		t.Fatalf("New did not say it started without Redis:\n%s", logs.String())
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "connected to redis") })
	waitFor(t, func() bool { // the breaker closes after its next probe
		_, err := guard.Get(ctx, g, "p5", d.load)
		return err == nil && g.Stats().Hits+g.Stats().LocalHits > 0
	})
	if _, err := g.Rebuild(ctx, ids("p", 10), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.Get(ctx, g, "unknown", d.load); !errors.Is(err, guard.ErrNotFound) {
		t.Fatal(err)
	}
	calls := d.calls.Load()
	if _, err := guard.Get(ctx, g, "unknown2", d.load); !errors.Is(err, guard.ErrNotFound) || d.calls.Load() != calls {
		t.Fatalf("the filter does not answer after reconnecting: %v, %d loads", err, d.calls.Load()-calls)
	}
}

// TestLoadTimeoutIsHard: a loader that ignores its ctx does not hold the Get
// past LoadTimeout; its late result is not cached, and nothing is counted as
// a Redis failure.
func TestLoadTimeoutIsHard(t *testing.T) {
	ctx := context.Background()
	c, g, _ := setup(t, 10, &guard.Options{LoadTimeout: 100 * time.Millisecond})
	finished, release := make(chan struct{}), make(chan struct{})
	stubborn := func(context.Context, string) (product, error) {
		defer close(finished)
		<-release // ignores ctx: returns only once the Get has given up on it
		return product{ID: "p1", Price: 1}, nil
	}
	_, err := guard.Get(ctx, g, "p1", stubborn)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want one wrapping context.DeadlineExceeded", err)
	}
	close(release)
	<-finished
	flush(t, g) // the load's goroutine has ended, and anything it would write with it
	if n := c.Exists(ctx, c.Prefix+":product:{p1}").Val(); n != 0 {
		t.Fatal("the late result was cached")
	}
	if st := g.Stats(); st.AbandonedLoads != 1 || st.RedisErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestClientSettingsAreChecked: New warns about client settings under which
// ctx deadlines do not bound a Get, or go-redis's client-side cache may
// answer a read with a copy older than a write, and is quiet when they are
// right.
func TestClientSettingsAreChecked(t *testing.T) {
	ctx := context.Background()
	srv, _ := redistest.Private(t)
	for _, c := range []struct {
		opts  *redis.Options
		warns int
	}{
		{&redis.Options{Network: srv.Network, Addr: srv.Addr}, 2},
		{&redis.Options{Network: srv.Network, Addr: srv.Addr, ContextTimeoutEnabled: true, DialerRetries: 1}, 0},
		{&redis.Options{Network: srv.Network, Addr: srv.Addr, ContextTimeoutEnabled: true, DialerRetries: 1,
			Protocol: 3, ClientSideCacheConfig: &redis.ClientSideCacheConfig{MaxEntries: 100}}, 1},
	} {
		rdb := redis.NewClient(c.opts)
		var logs redistest.Logs
		g, err := guard.New(ctx, rdb, "product", &guard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Filter: guard.FilterOptions{ExpectedItems: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(logs.String(), "level=WARN"); n != c.warns {
			t.Errorf("ContextTimeoutEnabled %v, DialerRetries %d: %d warnings, want %d:\n%s",
				c.opts.ContextTimeoutEnabled, c.opts.DialerRetries, n, c.warns, logs.String())
		}
		g.Close()
		rdb.Close()
	}
}

// TestOutageLogsAFewLines: Redis killed under 10,000 Gets (a client with
// ContextTimeoutEnabled and DialerRetries at their defaults):
// every Get is answered from the database, the first warning is written
// at once, and the whole outage writes at most 10 lines.
func TestOutageLogsAFewLines(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	var logs redistest.Logs
	srv, _, g := privateGuard(t, &guard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	d := newDB(10)
	ctx := context.Background()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 1 {
		t.Fatalf("first Get after the kill: %+v, %v", p, err)
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("no warning after the first failed Get:\n%s", logs.String())
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := range 1250 {
				id := fmt.Sprintf("p%d", (w+i)%10)
				if p, err := guard.Get(ctx, g, id, d.load); err != nil || p.ID != id {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of 10,000 Gets failed during the outage", n)
	}
	if n := strings.Count(logs.String(), "\n"); n > 10 {
		t.Fatalf("%d log lines for 10,000 Gets during an outage, want at most 10:\n%s", n, logs.String())
	}
	t.Logf("10,000 Gets with Redis down: %d log lines:\n%s", strings.Count(logs.String(), "\n"), logs.String())
}

// TestDeadlinesHoldWithADefaultClient: with a go-redis client whose
// ContextTimeoutEnabled is left off (ReadTimeout 3 s), Redis frozen
// (SIGSTOP) for 2 s under Gets with a 200 ms deadline: every Get ends near
// its deadline, not the client's ReadTimeout, and most are answered from the
// database within it.
func TestDeadlinesHoldWithADefaultClient(t *testing.T) {
	srv, _, g := privateGuard(t, &guard.Options{Logger: slog.New(slog.DiscardHandler)})
	d := newDB(10)
	ctx := context.Background()
	if p, err := guard.Get(ctx, g, "p1", d.load); err != nil || p.Price != 1 {
		t.Fatal(p, err)
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var thawOnce sync.Once
	thaw := func() { thawOnce.Do(func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) }) }
	defer thaw()
	time.AfterFunc(2*time.Second, thaw)
	var mu sync.Mutex
	var slowest time.Duration
	var answered, failed int
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; i < 10; i++ {
				id := fmt.Sprintf("p%d", (w+i)%10)
				gctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				start := time.Now()
				p, err := guard.Get(gctx, g, id, d.load)
				took := time.Since(start)
				cancel()
				mu.Lock()
				slowest = max(slowest, took)
				if err == nil && p.ID == id {
					answered++
				} else {
					failed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("Redis frozen: 40 Gets with a 200ms deadline, default client: %d answered, %d failed, slowest %v", answered, failed, slowest)
	if slowest > 450*time.Millisecond { // without the bound: the client's ReadTimeout, 3 s
		t.Fatalf("a Get with a 200ms deadline took %v while Redis was frozen", slowest)
	}
	if answered < 30 {
		t.Fatalf("%d of 40 Gets answered from the database while Redis was frozen, want most", answered)
	}
}

// TestWriteFailureLogsTheID: each write of one ID that cannot reach Redis
// logs a line that carries that ID (and its error names it too).
func TestWriteFailureLogsTheID(t *testing.T) {
	var logs redistest.Logs
	srv, _, g := privateGuard(t, &guard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	writes := map[string]func() error{
		"set":        func() error { return guard.Set(ctx, g, "p-set", product{ID: "p-set"}) },
		"invalidate": func() error { return g.Invalidate(ctx, "p-inv") },
		"delete":     func() error { return g.Delete(ctx, "p-del") },
		"add":        func() error { return g.Add(ctx, "p-add") },
	}
	for op, write := range writes {
		id := "p-" + op[:3]
		if err := write(); !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(err.Error(), strconv.Quote(id)) {
			t.Errorf("%s with Redis down: %v, want ErrUnavailable naming %q", op, err, id)
		}
		line := "redis " + op + ` failed" guard=product id=` + id + " "
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no line %q in the log:\n%s", line, logs.String())
		}
	}
}

// TestLinesAboutOneIDCarryIt: the lines about one entry that name its key
// name its ID too: a corrupt entry dropped, and a Get whose write of what it
// loaded failed (Redis killed during the load; the value is still served).
func TestLinesAboutOneIDCarryIt(t *testing.T) {
	var logs redistest.Logs
	srv, rdb, g := privateGuard(t, &guard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	load := func(_ context.Context, id string) (product, error) { return product{ID: id}, nil }
	if _, err := guard.Get(ctx, g, "p2", load); err != nil { // binds g: its field is known
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "cg:product:{p2}", guard.Field(g), "plain text").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.Get(ctx, g, "p2", load); err != nil {
		t.Fatal(err)
	}
	p, err := guard.Get(ctx, g, "p1", func(_ context.Context, id string) (product, error) {
		if err := srv.Kill(); err != nil {
			t.Error(err)
		}
		return product{ID: id}, nil
	})
	if err != nil || p.ID != "p1" {
		t.Fatalf("the load with Redis killed under it: %+v, %v; want it served", p, err)
	}
	if err := guard.Flush(ctx, g); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`"cacheguard: dropping a cache entry that does not decode (corrupt, or written by another type or version)" guard=product id=p2 `,
		`"cacheguard: redis write failed" guard=product id=p1 `,
	} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no line %q in the log:\n%s", line, logs.String())
		}
	}
}

// countingLog counts go-redis's calls before handing them on.
type countingLog struct {
	calls atomic.Int64
	next  interface {
		Printf(ctx context.Context, format string, v ...any)
	}
}

func (c *countingLog) Printf(ctx context.Context, format string, v ...any) {
	c.calls.Add(1)
	c.next.Printf(ctx, format, v...)
}

// TestRedisLoggerWhileRedisIsDown: with Redis down for 12 s under Gets and a
// client that pings every 100 ms, go-redis's own lines routed through
// RedisLogger are a few, the later ones with the count held back.
func TestRedisLoggerWhileRedisIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out go-redis's dial retries and the logger's 10 s window: make test")
	}
	var logs redistest.Logs
	log := slog.New(slog.NewTextHandler(&logs, nil)) // not limited itself
	srv, _, g := privateGuard(t, &guard.Options{Logger: log})
	redisLog := &countingLog{next: guard.RedisLogger(log)}
	redis.SetLogger(redisLog)
	t.Cleanup(logging.Enable) // go-redis's default logger
	plain := redis.NewClient(srv.Options())
	defer plain.Close()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	d := newDB(10)
	ctx := context.Background()
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		_ = plain.Ping(ctx).Err()
		if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
			t.Fatalf("Get with Redis down: %v", err)
		}
	}
	var lines []string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, `msg="redis: `) {
			lines = append(lines, l)
		}
	}
	calls := redisLog.calls.Load()
	t.Logf("Redis down 12 s: go-redis logged %d times, %d lines written:\n%s", calls, len(lines), strings.Join(lines, ""))
	if calls < 20 || len(lines) == 0 || len(lines) > 6 || !strings.Contains(strings.Join(lines, ""), "suppressed=") {
		t.Fatalf("go-redis logged %d times; %d lines written, want 1 to 6 with a count held back:\n%s", calls, len(lines), logs.String())
	}
}

// TestFrozenRedisBoundsPeekAndWrites: with the README's client and Redis
// frozen (SIGSTOP), a Peek and each write on a context without a deadline
// return within RedisTimeout (Peek within its 100 ms; plus a margin for a
// loaded machine), not when Redis resumes; the writes are kept for replay,
// and the Get behind a Peek that could not read loads through at once,
// from the database.
func TestFrozenRedisBoundsPeekAndWrites(t *testing.T) {
	srv, _ := redistest.Private(t)
	o := srv.Options()
	o.ContextTimeoutEnabled, o.DialerRetries, o.MaxRetries = true, 1, -1
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	const bound = 300 * time.Millisecond
	g := openRebuilt(t, rdb, guard.Options{Logger: slog.New(slog.DiscardHandler), Tuning: guard.Tuning{RedisTimeout: bound}}, 1000, 10)
	d := newDB(10)
	ctx := context.Background()
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var thawOnce sync.Once
	thaw := func() { thawOnce.Do(func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	time.AfterFunc(8*time.Second, thaw) // without the bound each call below waits for this
	timed := func(what string, f func() error) {
		t.Helper()
		start := time.Now()
		err := f()
		took := time.Since(start)
		t.Logf("Redis frozen: %s took %v (%v)", what, took, err)
		if took > bound+2*time.Second || !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("%s with Redis frozen: %v after %v; want ErrUnavailable within RedisTimeout %v", what, err, took, bound)
		}
	}
	var pctx context.Context
	timed("Peek", func() (err error) { pctx, _, err = g.Peek(ctx, "p2"); return err })
	loads := d.calls.Load()
	start := time.Now()
	p, err := guard.Get(pctx, g, "p2", d.load)
	if took := time.Since(start); err != nil || p.ID != "p2" || d.calls.Load() != loads+1 || took > time.Second {
		t.Errorf("Get after a Peek that could not read: %+v, %v, %d loads, %v; want p2 from one load at once", p, err, d.calls.Load()-loads, took)
	}
	timed("Set", func() error { return guard.Set(ctx, g, "p3", product{ID: "p3"}) })
	timed("Invalidate", func() error { return g.Invalidate(ctx, "p4") })
	timed("Delete", func() error { return g.Delete(ctx, "p5") })
	timed("Add", func() error { return g.Add(ctx, "p6") })
	if n := g.Stats().Unwritten; n < 4 {
		t.Fatalf("%d writes kept for replay, want the 4 that ran out", n)
	}
}

// slowRedis delays every command of a client by the set duration: a Redis
// that is slow but answers (a fork, a slow command).
type slowRedis struct{ by atomic.Int64 }

func (s *slowRedis) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(time.Duration(s.by.Load())) // the slow round trip is the test's subject
		return next(ctx, cmd)
	}
}
func (s *slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(time.Duration(s.by.Load()))
		return next(ctx, cmds)
	}
}

// TestPeekWaitDoesNotOpenTheBreaker: with Redis answering in 150 ms, past
// Peek's 100 ms but within RedisTimeout, Peeks run out (and their Gets
// load through), but the circuit breaker does not open: a Get of its own
// is still served from Redis.
func TestPeekWaitDoesNotOpenTheBreaker(t *testing.T) {
	c, g, d := setup(t, 10, nil)
	cache(t, g, d, "p1", "p2")
	slow := &slowRedis{}
	c.AddHook(slow)
	slow.by.Store(int64(150 * time.Millisecond))
	ctx := context.Background()
	for range 8 {
		if _, _, err := g.Peek(ctx, "p1"); !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("Peek with Redis answering in 150 ms: %v, want ErrUnavailable (its 100 ms ran out)", err)
		}
	}
	loads := d.calls.Load()
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if p, err := guard.Get(gctx, g, "p2", d.load); err != nil || p.Price != 2 || d.calls.Load() != loads {
		t.Fatalf("a Get of its own: %+v, %v, %d loads; want p2 from Redis; stats %+v", p, err, d.calls.Load()-loads, g.Stats())
	}
	if st := g.Stats(); st.BreakerOpens != 0 || st.LoadThroughs != 0 {
		t.Fatalf("stats %+v: the breaker opened on Peek's own wait", st)
	}
}
