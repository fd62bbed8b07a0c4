package guard_test

// The consistency checker: several OS processes run a random mix of creates,
// reads, updates, deletes and re-creates on a few hundred IDs against one
// source of truth, record every operation's start, end and result, and the
// parent checks the history afterwards (in the manner of a Jepsen history
// check). The rule: once a write's commit and its Add/Set/Delete/Invalidate
// have returned, every Get that starts afterwards, in any process, returns
// that write's result or a later one: never an older value, never a stale
// "not found".
//
// The source of truth is a row per ID in Redis (":db:{id}", written with a
// version counter by one atomic script), so every process shares it and every
// commit has a version, rising per ID in commit order. A row holds its
// version; a delete leaves no row.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func init() {
	childRoles["checker"] = childChecker
}

// commit writes the source of truth: a new version of the row of an ID, or
// its deletion, atomically with the version counter.
var commit = redis.NewScript(`
local v = redis.call('INCR', KEYS[2])
local existed = redis.call('EXISTS', KEYS[1])
if ARGV[1] == 'del' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], v) end
return {v, existed}`)

// op is one recorded operation.
type op struct {
	Proc   int    `json:"p"`
	Write  bool   `json:"w"`
	ID     string `json:"id"`
	Ver    int64  `json:"v"`  // a write: the version it committed; a read: the version it got, -1 for not found
	Exists bool   `json:"e"`  // a write: whether the row exists after it
	Start  int64  `json:"s"`  // unix nanos (one machine: one wall clock)
	End    int64  `json:"t"`  // unix nanos
	Err    string `json:"er"` // an operation that failed
	// Unwritten: a write committed whose Add/Set/Delete/Invalidate could
	// not reach Redis (ErrUnavailable): a write all the same, which the
	// Guard replays.
	Unwritten bool `json:"u,omitempty"`
	// Unconfirmed: a read answered ErrUnconfirmed (the ID is not in the
	// filter's copy of the reading process, Redis is down): a 503 by
	// design, neither a value nor a failure.
	Unconfirmed bool `json:"uc,omitempty"`
}

type checkerDB struct {
	rdb    redis.UniversalClient
	prefix string
}

func (d checkerDB) keys(id string) []string {
	return []string{d.prefix + ":db:{" + id + "}", d.prefix + ":db:{" + id + "}:ver"}
}

func (d checkerDB) write(ctx context.Context, id string, del bool) (ver int64, existed bool, err error) {
	arg := "put"
	if del {
		arg = "del"
	}
	res, err := commit.Run(ctx, d.rdb, d.keys(id), arg).Int64Slice()
	if err != nil {
		return 0, false, err
	}
	return res[0], res[1] == 1, nil
}

func (d checkerDB) load(ctx context.Context, id string) (int64, error) {
	v, err := d.rdb.Get(ctx, d.keys(id)[0]).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, guard.ErrNotFound
	}
	return v, err
}

func checkerID(i int) string { return "k" + strconv.Itoa(i) }

// childChecker runs WORKERS goroutines of OPS operations each. Worker w of
// process p writes the IDs i with i % (PROCS·WORKERS) == p·WORKERS + w, so
// every ID has one writer, in order (two Sets of one ID racing each other
// are last-to-Redis-wins: see guard.Set); every worker reads every ID.
func childChecker(rdb redis.UniversalClient) int {
	ctx := context.Background()
	prefix := os.Getenv("PREFIX")
	proc, _ := strconv.Atoi(os.Getenv("PROC"))
	procs, _ := strconv.Atoi(os.Getenv("PROCS"))
	workers, _ := strconv.Atoi(os.Getenv("WORKERS"))
	ops, _ := strconv.Atoi(os.Getenv("OPS"))
	ids, _ := strconv.Atoi(os.Getenv("IDS"))
	mode := os.Getenv("MODE")
	// PACE: a pause between operations, to spread them over an outage.
	pace, _ := time.ParseDuration(os.Getenv("PACE"))
	if c, ok := rdb.(*redis.Client); ok && os.Getenv("README_CLIENT") == "1" { // the client README builds
		o := c.Options()
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1
		rdb = redis.NewClient(o)
		defer rdb.Close()
	}
	opts := &guard.Options{KeyPrefix: prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}}
	if os.Getenv("LOCAL") == "1" {
		opts.Local = &guard.LocalOptions{TTL: time.Minute}
	}
	g, err := guard.New(ctx, rdb, "checked", opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer g.Close()
	db := checkerDB{rdb: rdb, prefix: prefix}
	if network, addr, ok := strings.Cut(os.Getenv("DB"), "|"); ok { // the source of truth on a server of its own
		db.rdb = redis.NewClient(&redis.Options{Network: network, Addr: addr})
		defer db.rdb.Close()
	}
	rows, err := guard.For(g, db.load)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	barrier(rdb, prefix+":barrier", int64(procs))

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var mu sync.Mutex // guards out
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(proc), uint64(w)))
			slot, stride := proc*workers+w, procs*workers
			var mine []int
			for i := slot; i < ids; i += stride {
				mine = append(mine, i)
			}
			exists := map[int]bool{}
			for _, i := range mine {
				exists[i] = i%2 == 0 // the parent created the even IDs
			}
			// Reads favour the first IDs, so reads land soon after writes.
			hot := rand.NewZipf(r, 1.1, 4, uint64(ids-1))
			var rec []op
			for range ops {
				time.Sleep(pace) // the workload's rate: a pace, not a state
				o := op{Proc: proc}
				var err error
				if r.IntN(10) < 3 && len(mine) > 0 {
					i := mine[r.IntN(len(mine))]
					o.Write, o.ID = true, checkerID(i)
					del := exists[i] && r.IntN(3) == 0
					o.Start = time.Now().UnixNano()
					var existed bool
					o.Ver, existed, err = db.write(ctx, o.ID, del)
					if err == nil {
						switch {
						case del && mode == "set":
							err = rows.Delete(ctx, o.ID)
						case del:
							err = rows.Invalidate(ctx, o.ID)
						case !existed:
							err = rows.Add(ctx, o.ID)
						case mode == "set":
							err = rows.Set(ctx, o.ID, o.Ver)
						default:
							err = rows.Invalidate(ctx, o.ID)
						}
					}
					o.End = time.Now().UnixNano()
					exists[i], o.Exists = !del, !del
					if o.Ver > 0 && errors.Is(err, guard.ErrUnavailable) { // committed; the Guard replays it
						o.Unwritten, err = true, nil
					}
				} else {
					o.ID = checkerID(int(hot.Uint64()))
					o.Start = time.Now().UnixNano()
					var v int64
					v, err = rows.Get(ctx, o.ID)
					o.End = time.Now().UnixNano()
					o.Ver = v
					if errors.Is(err, guard.ErrNotFound) {
						o.Ver, err = -1, nil
					}
				}
				if err != nil {
					o.Err, o.Unconfirmed = err.Error(), errors.Is(err, guard.ErrUnconfirmed)
				}
				rec = append(rec, o)
			}
			mu.Lock()
			defer mu.Unlock()
			enc := json.NewEncoder(out)
			for _, o := range rec {
				_ = enc.Encode(o)
			}
		}()
	}
	wg.Wait()
	return 0
}

// verdict of a history check.
type checked struct {
	Reads, Writes, Failed int
	Unwritten             int           // writes whose cache write failed (replayed by their Guard)
	Unconfirmed           int           // reads answered ErrUnconfirmed during an outage (IDs created elsewhere since the copy)
	Stale                 int           // reads that broke the rule
	OwnStale              int           // of those, reads whose process made the write they missed
	MaxStale              time.Duration // the longest time after the missed write returned
	Examples              []string
}

// checkHistory applies the rule to every read.
func checkHistory(history []op) checked {
	var c checked
	writes := map[string][]op{}
	for _, o := range history {
		switch {
		case o.Unconfirmed:
			c.Unconfirmed++
		case o.Err != "":
			c.Failed++
			if len(c.Examples) < 5 {
				c.Examples = append(c.Examples, "failed: "+o.Err)
			}
		case o.Write:
			writes[o.ID] = append(writes[o.ID], o)
			c.Writes++
			if o.Unwritten {
				c.Unwritten++
			}
		}
	}
	for _, ws := range writes {
		slices.SortFunc(ws, func(a, b op) int { return int(a.Ver - b.Ver) })
	}
	for _, r := range history {
		if r.Write || r.Err != "" {
			continue
		}
		c.Reads++
		var last, lastOwn *op // the newest writes that returned before r started
		for i := range writes[r.ID] {
			w := &writes[r.ID][i]
			if w.End < r.Start {
				if last == nil || w.Ver > last.Ver {
					last = w
				}
				if w.Proc == r.Proc && (lastOwn == nil || w.Ver > lastOwn.Ver) {
					lastOwn = w
				}
			}
		}
		ok := func(w *op) bool {
			if w == nil {
				return true
			}
			if r.Ver >= 0 { // a value: w's or a later one that had begun by the end of r
				for _, x := range writes[r.ID] {
					if x.Ver == r.Ver {
						return x.Ver >= w.Ver && x.Exists && x.Start < r.End
					}
				}
				return false
			}
			// not found: w is a delete, or a later delete had begun by the end of r
			for _, x := range writes[r.ID] {
				if x.Ver >= w.Ver && !x.Exists && x.Start < r.End {
					return true
				}
			}
			return false
		}
		if !ok(last) {
			c.Stale++
			if !ok(lastOwn) {
				c.OwnStale++
			}
			c.MaxStale = max(c.MaxStale, time.Duration(r.Start-last.End))
			if len(c.Examples) < 5 {
				c.Examples = append(c.Examples, fmt.Sprintf("proc %d read %s = %d at %d; version %d (exists %v) by proc %d returned at %d",
					r.Proc, r.ID, r.Ver, r.Start, last.Ver, last.Exists, last.Proc, last.End))
			}
		}
	}
	return c
}

// runChecker prepares the source of truth and the filter, runs the
// processes and checks their history. With outage, the cache is a Redis of
// its own (the source of truth stays up), stopped with SHUTDOWN SAVE for a
// second in the middle of the run and restarted from its dump.
func runChecker(t *testing.T, mode string, local, outage bool) checked {
	t.Helper()
	ctx := context.Background()
	c := redistest.Connect(t)
	const procs, workers, ops, ids = 3, 8, 2500, 200
	var cache redis.UniversalClient = c
	var srv *redisserver.Server
	if outage {
		srv, cache = redistest.Private(t)
	}
	g, err := guard.New(ctx, cache, "checked", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	db := checkerDB{rdb: c, prefix: c.Prefix}
	var history []op
	var initial []string
	for i := 0; i < ids; i += 2 { // the even IDs exist at the start
		start := time.Now().UnixNano()
		v, _, err := db.write(ctx, checkerID(i), false)
		if err != nil {
			t.Fatal(err)
		}
		history = append(history, op{Proc: -1, Write: true, ID: checkerID(i), Ver: v, Exists: true, Start: start, End: time.Now().UnixNano()})
		initial = append(initial, checkerID(i))
	}
	if _, err := g.Rebuild(ctx, guard.IDs(initial), nil); err != nil {
		t.Fatal(err)
	}
	localFlag := "0"
	if local {
		localFlag = "1"
	}
	var children []*redistest.Child
	for p := range procs {
		env := []string{"PREFIX=" + c.Prefix, "PROC=" + strconv.Itoa(p), "PROCS=" + strconv.Itoa(procs),
			"WORKERS=" + strconv.Itoa(workers), "OPS=" + strconv.Itoa(ops), "IDS=" + strconv.Itoa(ids), "MODE=" + mode, "LOCAL=" + localFlag}
		if outage {
			db := redistest.Server(t)
			env = append(env, "DB="+db.Network+"|"+db.Addr, "PACE=1ms", "README_CLIENT=1") // 2.5 s of operations
			children = append(children, redistest.SpawnOn(t, srv, "checker", env...))
		} else {
			children = append(children, redistest.Spawn(t, "checker", env...))
		}
	}
	if outage {
		stopAndRestore(t, srv, cache, c.Prefix+":barrier", procs)
	}
	for _, ch := range children {
		ch.Wait(t, false)
		dec := json.NewDecoder(bytes.NewReader(ch.Stdout.Bytes()))
		for {
			var o op
			if err := dec.Decode(&o); err != nil {
				break
			}
			history = append(history, o)
		}
	}
	if got, want := len(history)-len(initial), procs*workers*ops; got != want {
		t.Fatalf("history has %d operations, want %d", got, want)
	}
	res := checkHistory(history)
	t.Logf("mode %s, local %v, outage %v: %d processes, %d operations (%d reads, %d writes, %d of them unwritten), %d failed, "+
		"%d stale reads (%d of the reader's own writes), longest stale %v", mode, local, outage, procs,
		res.Reads+res.Writes+res.Failed, res.Reads, res.Writes, res.Unwritten, res.Failed, res.Stale, res.OwnStale, res.MaxStale)
	for _, e := range res.Examples {
		t.Log(e)
	}
	return res
}

// TestConsistencyChecker: with Options.Local off, 0 stale reads over 60,000
// operations in 3 processes (in each mode), with the write-through calls (Add, Set, Delete)
// and with Add + Invalidate.
func TestConsistencyChecker(t *testing.T) {
	clusterToo(t)
	if testing.Short() {
		t.Skip("a long checked history: make test")
	}
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	for _, mode := range []string{"set", "invalidate"} {
		t.Run(mode, func(t *testing.T) {
			res := runChecker(t, mode, false, false)
			if res.Failed != 0 || res.Stale != 0 || res.Reads < 10_000 || res.Writes < 3_000 {
				t.Fatalf("%+v", res)
			}
		})
	}
}

// TestConsistencyCheckerLocal: with Options.Local on, a process sees its own
// writes at once (asserted: 0); other processes drop their copies when the
// invalidation message arrives, so stale reads from them are measured and
// reported, not asserted (see LocalOptions).
func TestConsistencyCheckerLocal(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	res := runChecker(t, "set", true, false)
	if res.Failed != 0 || res.OwnStale != 0 || res.Reads < 10_000 {
		t.Fatalf("%+v", res)
	}
	t.Logf("Local: %.1f stale reads per 10,000 reads, the longest %v after the write returned",
		float64(res.Stale)*10_000/float64(res.Reads), res.MaxStale)
}

// outageFor is how long the cache is down. The processes use README's
// client (DialerRetries 1): with go-redis's default retries a write waits
// out a one-second outage and lands after the restart.
const outageFor = time.Second

// stopAndRestore waits for the checker's processes to pass their barrier,
// lets them run, stops the cache with SHUTDOWN SAVE, and a second later
// starts it again from its dump.
func stopAndRestore(t *testing.T, srv *redisserver.Server, cache redis.UniversalClient, barrierKey string, procs int) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 30*time.Second, "the checker's processes started", func() bool {
		n, _ := cache.Get(ctx, barrierKey).Int()
		return n >= procs
	})
	time.Sleep(500 * time.Millisecond) // the workload runs a while before the fault: a period, not a state
	if err := cache.ShutdownSave(ctx).Err(); err != nil && !errors.Is(err, redis.ErrClosed) {
		t.Logf("shutdown: %v", err) // the connection drops as Redis exits
	}
	began := time.Now()
	time.Sleep(outageFor) // the outage is a period: nothing to wait on
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("the cache was down for %v; restarted from its dump with %d keys", time.Since(began).Round(time.Millisecond), cache.DBSize(ctx).Val())
}

// TestConsistencyCheckerOutage: the checker with the cache stopped for a
// second mid-run (SHUTDOWN SAVE) while writes go on, and restarted from its
// dump, which holds entries that the failed writes meant to replace. A
// process whose write failed never reads older than its own writes: 0
// stale reads, asserted. The other processes read stale entries until the
// writer's replay lands: counted and reported.
func TestConsistencyCheckerOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a long checked history through an outage: make test")
	}
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	res := runChecker(t, "set", false, true)
	if res.OwnStale != 0 || res.Failed != 0 || res.Reads < 10_000 || res.Unwritten == 0 {
		t.Fatalf("%+v", res)
	}
	t.Logf("outage: %d writes unwritten and replayed; %d failed operations; %d reads unconfirmed; "+
		"%d stale reads in other processes, the longest %v after the write returned",
		res.Unwritten, res.Failed, res.Unconfirmed, res.Stale-res.OwnStale, res.MaxStale)
}
