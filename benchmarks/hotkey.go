package main

import (
	"cmp"
	"context"
	"fmt"
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

	"github.com/cacheguard/cacheguard/internal/keyspace"
)

// Hot-key shape by default: the key's TTL and the loader's time. The TTL
// is 1 s: go-zero stores TTLs in whole seconds and go-redis/cache replaces
// any TTL under a second with its 1-hour default. -hot-ttl and -hot-load
// change them (see hotShape).
const (
	hotTTLDefault  = time.Second
	hotLoadDefault = 10 * time.Millisecond
)

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
	Clients        int           // how many clients asked (-hot-clients)
	Errors         int64         // Gets that failed (asking at once only: otherwise the run fails)
	// Absent is the share of the run the key's Redis entry did not exist,
	// on Redis's clock (absence); the median of AbsentRuns.
	Absent float64

	GetsRuns   []int64         // Gets of each round (medianHot)
	MaxRuns    []time.Duration // the slowest Get of each round
	AbsentRuns []float64       // each round's Absent
}

// medianHot is a contender's hot-key row over its rounds: the round with
// the median Gets, with Max the median of the rounds' slowest Gets, and
// every round's Gets and slowest Get kept beside.
func medianHot(runs []HotKeyResult) HotKeyResult {
	byGets := slices.Clone(runs)
	slices.SortFunc(byGets, func(a, b HotKeyResult) int { return cmp.Compare(a.Gets, b.Gets) })
	m := byGets[len(byGets)/2]
	maxes := make([]time.Duration, len(runs))
	absent := make([]float64, len(runs))
	for i, r := range runs {
		m.GetsRuns = append(m.GetsRuns, r.Gets)
		maxes[i], absent[i] = r.Max, r.Absent
	}
	m.MaxRuns, m.AbsentRuns = slices.Clone(maxes), slices.Clone(absent)
	slices.Sort(maxes)
	slices.Sort(absent)
	m.Max, m.Absent = maxes[len(maxes)/2], absent[len(absent)/2]
	return m
}

// hotPauseDefault is each hot-key client's pause between Gets in table 4;
// table 4b runs with none (see hotKey).
const hotPauseDefault = 100 * time.Microsecond

// Table 4c: the hot key of a saturated service, each client asking again
// at once, at TTL 200 ms and a 20 ms load (25 expiries a run, a load a
// tenth of the TTL), with 4 and with 32 clients. Its contenders are those
// that keep a sub-second TTL and load once per expiry, rueidisaside the
// peer among them (hotAtOnceNames).
const (
	hotAtOnceTTL  = 200 * time.Millisecond
	hotAtOnceLoad = 20 * time.Millisecond
)

var (
	hotAtOnceClients = []int{4, 32}
	hotAtOnceOf      = []string{"rueidisaside", "cacheguard", "cacheguard+local", "cacheguard+refresh", "cacheguard+local+refresh"}
)

// hotAtOnceNames is table 4c's contenders among those that run (-only).
func hotAtOnceNames() []string {
	return slices.DeleteFunc(slices.Clone(hotAtOnceOf), func(n string) bool { return !slices.Contains(contenderNames, n) })
}

// hotShape is the hot key's TTL and loader time for a run, and how many
// clients ask for it (0: 32).
type hotShape struct {
	ttl, load time.Duration
	clients   int
}

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
	// for long, and the column measures what a hit costs. Below 0
	// (-hot-pause -1ns) each asks again at once, as a saturated service's
	// handlers do: the slowest Get then includes the scheduler's slices.
	workers := cmp.Or(shape.clients, 32)
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
	var failed atomic.Int64 // asking at once (pause < 0), a contender's own timeouts can run out: counted, not fatal
	runtime.GC()
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	watch, err := startWatch(ctx, e.addr, c.RedisKey("hot"), stop)
	if err != nil {
		return HotKeyResult{}, err
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl := &tallies[w]
			for time.Now().Before(stop) {
				t := time.Now()
				if _, err := c.Get(ctx, "hot", load); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				took := time.Since(t)
				tl.max = max(tl.max, took)
				if took >= loadTime {
					tl.slow++
				}
				samples[w].add(took)
				gets.Add(1)
				switch {
				case pause > 0:
					time.Sleep(pause)
				case pause == 0:
					runtime.Gosched()
				} // below 0: ask again at once (the scheduler's own preemption alone)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil && pause >= 0 {
		return HotKeyResult{}, fmt.Errorf("%s: %w", name, err)
	}
	absent, err := watch()
	if err != nil {
		return HotKeyResult{}, fmt.Errorf("%s: watching the entry: %w", name, err)
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
		Slow: slow, TTL: ttl, LoadTime: loadTime, Clients: workers, Errors: failed.Load(), Absent: absent}, nil
}

// startWatch starts this binary again ("watch") to ask Redis every
// millisecond until stop whether key exists; the returned func waits for
// it and returns the share of the time the key did not. Another process:
// the clients saturate this one's processors, and a watcher among them
// would see the entry only between their slices (up to tens of ms late).
func startWatch(ctx context.Context, addr, key string, stop time.Time) (func() (float64, error), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out strings.Builder
	cmd := exec.CommandContext(ctx, self, "watch", addr, key, strconv.FormatInt(stop.UnixNano(), 10))
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() (float64, error) {
		if err := cmd.Wait(); err != nil {
			return 0, err
		}
		return strconv.ParseFloat(strings.TrimSpace(out.String()), 64)
	}, nil
}

// runWatch is the "watch" child (startWatch): it asks Redis every
// millisecond about key and prints the share of the time it was absent, on
// Redis's clock (see absence). A key holding a contender's lock
// (rueidisaside keeps its lock in the value's key) counts as present.
func runWatch(ctx context.Context, addr, key, stopNanos string) error {
	ns, err := strconv.ParseInt(stopNanos, 10, 64)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var a absence
	for {
		var exists *redis.IntCmd
		var expireAt *redis.Cmd
		var filled *redis.StringCmd
		var now *redis.TimeCmd
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			exists = p.Exists(ctx, key)
			expireAt = p.Do(ctx, "pexpiretime", key)
			filled = p.HGet(ctx, key, keyspace.Filled) // WRONGTYPE on a string: no stamp
			now = p.Time(ctx)
			return nil
		})
		n, err := exists.Result()
		if err != nil {
			return err
		}
		t, err := now.Result()
		if err != nil {
			return err
		}
		at, err := expireAt.Int64() // -2 for no key: never an error but a real one
		if err != nil {
			return fmt.Errorf("PEXPIRETIME (Redis 7.0 or later): %w", err)
		}
		stamp, _ := filled.Int64() // redis.Nil or WRONGTYPE: no fill time
		a.add(probe{at: t.UnixMicro(), present: n == 1, expiresMs: at, filled: stamp})
		if time.Now().UnixNano() >= ns {
			_, err := fmt.Println(a.share())
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// probe is what one watcher round trip read, on Redis's clock: when it
// ran (µs), whether the key existed, when it expires (PEXPIRETIME, ms; -1:
// never, -2: no key), and the fill time cacheguard's writes stamp in the
// entry (µs; 0: none).
type probe struct {
	at        int64
	present   bool
	expiresMs int64
	filled    int64
}

// absence adds up the time a key was absent between probes, on Redis's
// clock. An entry's end is Redis's own: it expires once the clock passes
// its PEXPIRETIME. Its refill is the fill time the entry carries
// (cacheguard's), else the midpoint between the probe that missed it and
// the one that found it. Timing the probes on the watcher's clock made a
// contender that saturates the processors after a refill (a local copy's
// hits) look absent longer: the watcher's next probe waited for a
// processor, and the time until its answer counted as absent (1 point of
// the run in docs/benchmarks.md's table 4c).
type absence struct {
	first, last probe
	started     bool
	absent      int64 // µs
}

func (a *absence) add(p probe) {
	if !a.started {
		a.first, a.last, a.started = p, p, true
		return
	}
	q := a.last
	a.last = p
	within := func(t int64) int64 { return min(max(t, q.at), p.at) }
	mid := (q.at + p.at) / 2
	switch {
	case q.present && p.present:
		// Expired and refilled between the probes: both ends are Redis's
		// (without a fill time there is no telling: counted present).
		if p.filled != 0 && p.filled != q.filled && q.expiresMs > 0 {
			a.absent += max(within(p.filled)-within((q.expiresMs+1)*1000), 0)
		}
	case q.present: // it went: expired, or deleted before its time (no telling when: the midpoint)
		from := mid
		if end := (q.expiresMs + 1) * 1000; q.expiresMs > 0 && end <= p.at {
			from = within(end)
		}
		a.absent += p.at - from
	case p.present: // it came back
		to := mid
		if p.filled != 0 {
			to = within(p.filled)
		}
		a.absent += to - q.at
	default:
		a.absent += p.at - q.at
	}
}

// share is the share of the time from the first probe to the last that the
// key was absent.
func (a *absence) share() float64 {
	return float64(a.absent) / float64(max(a.last.at-a.first.at, 1))
}
