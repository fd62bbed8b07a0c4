package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// clientHook is a redis.Hook on a Guard's client (hooked). While watchOff, it
// fails the watcher's EXISTS of the Guard's marks without sending them
// (see touch): the watcher takes Redis for down and checks nothing, so only
// a read notices the writes Redis lost (tests of that, and the control of
// the watcher's); no other command of the Guard's is an EXISTS of a mark.
// sending, if set, runs before each command is sent; answered, after
// each command's answer, before the Guard sees it.
type clientHook struct {
	watchOff atomic.Bool
	sending  atomic.Pointer[func(cmd redis.Cmder)]
	answered atomic.Pointer[func(cmd redis.Cmder)]
}

var (
	errWatchOff = errors.New("test: the watcher's EXISTS not sent")
	clientHooks sync.Map // *guard.Guard → its client's *clientHook
)

// hooked installs a clientHook on rdb, before a Guard uses it; register
// that Guard with clientHooks.Store(g, h) for hookOf.
func hooked(rdb redis.UniversalClient) *clientHook {
	h := &clientHook{}
	rdb.AddHook(h)
	return h
}

// hookOf is the clientHook of g's client.
func hookOf(t *testing.T, g *guard.Guard) *clientHook {
	t.Helper()
	h, ok := clientHooks.Load(g)
	if !ok {
		t.Fatal("the Guard's client has no clientHook")
	}
	return h.(*clientHook)
}

// setWatch turns g's watcher off or back on (its client is hooked).
func setWatch(t *testing.T, g *guard.Guard, on bool) { hookOf(t, g).watchOff.Store(!on) }

func (h *clientHook) touches(cmd redis.Cmder) bool {
	return h.watchOff.Load() && cmd.Name() == "exists" && len(cmd.Args()) > 1 && strings.Contains(fmt.Sprint(cmd.Args()[1]), ":mark:")
}

func (h *clientHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *clientHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.touches(cmd) {
			cmd.SetErr(errWatchOff)
			return errWatchOff
		}
		if f := h.sending.Load(); f != nil {
			(*f)(cmd)
		}
		err := next(ctx, cmd)
		if f := h.answered.Load(); f != nil {
			(*f)(cmd)
		}
		return err
	}
}
func (h *clientHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && h.touches(cmds[0]) { // in a cluster, one EXISTS per master
			for _, c := range cmds {
				c.SetErr(errWatchOff)
			}
			return errWatchOff
		}
		if f := h.sending.Load(); f != nil {
			for _, c := range cmds {
				(*f)(c)
			}
		}
		err := next(ctx, cmds)
		if f := h.answered.Load(); f != nil {
			for _, c := range cmds {
				(*f)(c)
			}
		}
		return err
	}
}

// lostWrites sets up the scenario of the tests below: a private Redis, a
// client with go-redis's defaults (it redials and retries without a word),
// a writer (its client hooked) and another Guard that both cached p0..p9
// as loaded from d.
func lostWrites(t *testing.T) (*redisserver.Server, *db, *guard.Guard, *guard.Guard) {
	t.Helper()
	srv, _ := redistest.Private(t)
	d := newDB(10)
	var gs []*guard.Guard
	for i := range 2 {
		rdb := redis.NewClient(srv.Options())
		t.Cleanup(func() { _ = rdb.Close() })
		h := hooked(rdb)
		g := openRebuilt(t, rdb, guard.Options{}, 1000, 10)
		if i == 0 {
			clientHooks.Store(g, h)
			t.Cleanup(func() { clientHooks.Delete(g) })
		}
		for i := range 10 {
			if _, err := guard.Get(context.Background(), g, pid(i), d.load); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, g)
		gs = append(gs, g)
	}
	// The second Guard's rebuild switched generations: the first moves to
	// it now (a probe), and its copy of the filter with it, so that no
	// refresh of the copy runs later, unasked, while a test restarts Redis.
	ctx := context.Background()
	if _, err := gs[0].MayExist(ctx, "p0"); err != nil {
		t.Fatal(err)
	}
	in, err := gs[1].Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the first Guard's copy of the filter is of the second's generation", func() bool {
		return guard.CopyGeneration(gs[0]) == in.Generation
	})
	return srv, d, gs[0], gs[1]
}

// saved is lostWrites's writer after a SAVE: the dump that crash restarts
// Redis from holds the entries as cached. rdb is a client of the test's.
func saved(t *testing.T) (*redisserver.Server, *db, *guard.Guard, *redis.Client) {
	t.Helper()
	srv, d, writer, _ := lostWrites(t)
	rdb := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return srv, d, writer, rdb
}

// update commits a new price for ids in d and Sets it through g.
func update(t *testing.T, g *guard.Guard, d *db, price int, ids ...string) {
	t.Helper()
	for _, id := range ids {
		p := product{ID: id, Name: "updated " + id, Price: price}
		d.set(p)
		if err := guard.Set(context.Background(), g, id, p); err != nil {
			t.Fatal(err)
		}
	}
}

// crash SIGKILLs Redis and starts it again from its dump, with no command
// of the Guards' in between.
func crash(t *testing.T, srv *redisserver.Server) {
	t.Helper()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// stale counts the answers for ids that differ from d, over n rounds.
func stale(t *testing.T, g *guard.Guard, d *db, n int, ids ...string) int {
	t.Helper()
	bad := 0
	for range n {
		for _, id := range ids {
			want, _ := d.load(context.Background(), id)
			if p, err := guard.Get(context.Background(), g, id, d.load); err != nil || p != want {
				bad++
			}
		}
	}
	return bad
}

// waitReplayed waits until g holds no unwritten ID.
func waitReplayed(t *testing.T, g *guard.Guard) {
	t.Helper()
	eventually(t, 10*time.Second, "replayed", func() bool { return g.Stats().Unwritten == 0 })
}

// TestQuickRestartFromADump: a Set returns nil, then Redis is killed and
// restarts from a dump made before it, faster than any command of the
// Guard's could fail: go-redis redials silently. The writer's marks say
// Redis lost the Set, so it never answers the old row, and after the
// replay neither does the other process. The control: the other process,
// read first, finds the old entry Redis came back with.
func TestQuickRestartFromADump(t *testing.T) {
	srv, d, writer, other := lostWrites(t)
	ctx := context.Background()
	if err := redis.NewClient(srv.Options()).Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	update(t, writer, d, 303, "p3")
	setWatch(t, writer, false) // the writer's Gets notice, not its watcher (TestIdleGuardRepairsLostWrites)
	crash(t, srv)
	if p, err := guard.Get(ctx, other, "p3", d.load); err != nil || p.Price != 3 {
		t.Fatalf("control: the other process reads %+v, %v; want the old row Redis came back with", p, err)
	}
	if n := stale(t, writer, d, 100, "p3"); n > 0 {
		t.Fatalf("the writer answered %d of 100 Gets with the row its acknowledged Set replaced: %+v", n, writer.Stats())
	}
	if st := writer.Stats(); st.WritesLost != 1 || st.RedisErrors != 0 {
		t.Fatalf("WritesLost %d, RedisErrors %d: want the one lost Set noticed with no failed command", st.WritesLost, st.RedisErrors)
	}
	waitReplayed(t, writer)
	if n := stale(t, other, d, 1, "p3"); n > 0 {
		t.Fatal("the other process reads the old row after the replay")
	}
}

// TestRestartFromAnOldDump: Redis's default snapshots are minutes apart, so
// a crash loses writes far older than a few seconds: Sets made "2 minutes"
// before the crash (AgeWrites) and one made just before are all replayed.
// Writes older than the Guard remembers (an hour) are not known one by
// one: every entry of the Guard is dropped instead.
func TestRestartFromAnOldDump(t *testing.T) {
	t.Run("within the hour", func(t *testing.T) {
		srv, d, writer, _ := lostWrites(t)
		if err := redis.NewClient(srv.Options()).Save(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		update(t, writer, d, 1000, "p3", "p4")
		guard.AgeWrites(writer, 2*time.Minute)
		update(t, writer, d, 1000, "p5")
		crash(t, srv)
		if n := stale(t, writer, d, 20, "p3", "p4", "p5"); n > 0 {
			t.Fatalf("%d stale answers after a restart from a dump older than the writes", n)
		}
		if st := writer.Stats(); st.WritesLost != 3 {
			t.Fatalf("WritesLost %d, want 3", st.WritesLost)
		}
	})
	t.Run("past the hour", func(t *testing.T) {
		srv, d, writer, other := lostWrites(t)
		if err := redis.NewClient(srv.Options()).Save(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		update(t, writer, d, 1000, "p3")
		guard.AgeWrites(writer, 2*time.Hour)
		update(t, writer, d, 1000, "p5") // p3 leaves the ring: past recentFor
		crash(t, srv)
		if n := stale(t, writer, d, 20, "p3", "p5"); n > 0 {
			t.Fatalf("%d stale answers after a restart from a dump older than the remembered writes", n)
		}
		if st := writer.Stats(); st.WritesLost != 2 { // p5, and the overflow for p3
			t.Fatalf("WritesLost %d, want 2 (one write and the overflow)", st.WritesLost)
		}
		waitReplayed(t, writer)
		if n := stale(t, other, d, 1, "p3", "p5"); n > 0 {
			t.Fatal("the other process reads old rows after every entry was dropped")
		}
	})
}

// TestReplayLandsBetweenReadAndAnswer replays a race step by step: the
// Get's read (over the connection redialed after a restart) returns the
// old entry; before the Get goes on (a hook on the writer's client holds
// the answer), another Get's read makes the check that finds the Set lost,
// and the replay it starts deletes the entry. The Get must not answer what
// it read. The hook checks that the interleaving happened: the entry the
// read returned is gone from Redis when the Get goes on.
func TestReplayLandsBetweenReadAndAnswer(t *testing.T) {
	srv, d, writer, rdb := saved(t)
	ctx := context.Background()
	update(t, writer, d, 303, "p3")
	setWatch(t, writer, false) // a read finds the Set lost
	// A read makes the check due since the Set: none is due after the crash.
	if _, err := guard.Get(ctx, writer, "p1", d.load); err != nil {
		t.Fatal(err)
	}
	crash(t, srv)
	vkey, _ := keyspace.ForGuard("cg", "product", 128).Value("p3") // the default KeyPrefix
	var held, interleaved atomic.Bool
	other := make(chan error, 1)
	hold := func(cmd redis.Cmder) {
		if a := cmd.Args(); cmd.Name() != "hget" || len(a) < 2 || a[1] != vkey || !held.CompareAndSwap(false, true) {
			return
		}
		go func() { _, err := guard.Get(ctx, writer, "p0", d.load); other <- err }()
		interleaved.Store(redistest.Poll(10*time.Second, func() bool {
			n, err := rdb.Exists(ctx, vkey).Result()
			st := writer.Stats()
			return err == nil && n == 0 && st.WritesLost == 1 && st.Unwritten == 0
		}))

	}
	hookOf(t, writer).answered.Store(&hold)
	p, err := guard.Get(ctx, writer, "p3", d.load)
	hookOf(t, writer).answered.Store(nil)
	if !interleaved.Load() {
		t.Fatal("control: the replay did not land between the read and the answer; the test proves nothing")
	}
	if err := <-other; err != nil {
		t.Fatalf("the other Get: %v", err)
	}
	if err != nil || p.Price != 303 {
		t.Fatalf("a Get whose read a replay overtook answered %+v, %v; want the updated row", p, err)
	}
}

// TestIdleGuardRepairsLostWrites: the writer Invalidates p3 and Sets p4
// after a SAVE, then neither reads nor writes; Redis is SIGKILLed and
// restarts from the dump, with the old entries. The writer's watcher
// notices the lost writes and replays them (the entries deleted) with no
// Get, within 5 s of Redis answering (it looks every second; the room is
// for a loaded machine). The control turns the watcher off: the old
// entries stay.
func TestIdleGuardRepairsLostWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts Redis and waits for the watcher")
	}
	for _, watch := range []bool{true, false} {
		name := map[bool]string{true: "watcher", false: "control: no watcher"}[watch]
		t.Run(name, func(t *testing.T) {
			srv, d, writer, rdb := saved(t)
			ctx := context.Background()
			d.set(product{ID: "p3", Name: "changed p3", Price: 303})
			if err := writer.Invalidate(ctx, "p3"); err != nil {
				t.Fatal(err)
			}
			update(t, writer, d, 404, "p4")
			setWatch(t, writer, false) // until the old entries are seen back
			before := writer.Stats()
			crash(t, srv)
			back := time.Now()
			keys := keyspace.ForGuard("cg", "product", 128) // the default KeyPrefix
			p3, _ := keys.Value("p3")
			p4, _ := keys.Value("p4")
			gone := func() bool { n, err := rdb.Exists(ctx, p3, p4).Result(); return err == nil && n == 0 }
			if n, err := rdb.Exists(ctx, p3, p4).Result(); err != nil || n != 2 {
				t.Fatalf("Redis came back with %d of the 2 old entries (%v): the test proves nothing", n, err)
			}
			setWatch(t, writer, watch)
			if !watch {
				// Three turns of a watcher: nothing but it would mend them.
				if redistest.Poll(3*guard.WatchEvery, gone) {
					t.Fatal("control: the old entries went with the watcher off; the test proves nothing")
				}
				if n := stale(t, writer, d, 1, "p3", "p4"); n > 0 { // the read notices instead
					t.Fatalf("%d stale answers from the writer's Gets", n)
				}
				return
			}
			eventually(t, time.Until(back.Add(5*time.Second)), "the old entries deleted without a Get, within 5 s", gone)
			t.Logf("repaired %v after Redis answered again", time.Since(back).Round(time.Millisecond))
			if st := writer.Stats(); st.WritesLost != 2 || st.Hits+st.Misses != before.Hits+before.Misses {
				t.Fatalf("WritesLost %d, %d Gets: want the 2 lost writes noticed without a Get",
					st.WritesLost, st.Hits+st.Misses-before.Hits-before.Misses)
			}
			if n := stale(t, writer, d, 1, "p3", "p4"); n > 0 {
				t.Fatalf("%d stale answers after the repair", n)
			}
		})
	}
}

// TestLostWritesLogAddsUp: 1,500 Invalidates of 1,200 IDs (300 of them
// twice), then Redis restarts empty. The WARN that says Redis lost them
// counts the writes and the IDs they come to, and the INFO line that ends
// the replay (two batches) counts those IDs.
func TestLostWritesLogAddsUp(t *testing.T) {
	var logs redistest.Logs
	srv, _, g := privateGuard(t, &guard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Filter: guard.FilterOptions{ExpectedItems: 10_000}})
	ctx := context.Background()
	const distinct, twice = 1200, 300
	for i := range distinct + twice {
		if err := g.Invalidate(ctx, pid(i%distinct)); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, srv) // no dump: Redis restarts empty
	field := func(line, name string) int {
		m := regexp.MustCompile(` ` + name + `=(\d+)`).FindStringSubmatch(line)
		if m == nil {
			return -1
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	var lost []string
	replayed, batches := 0, 0
	// The WARN, then INFO lines until they add up to its IDs (or 10 s).
	redistest.Poll(10*time.Second, func() bool {
		lost, replayed, batches = nil, 0, 0
		for line := range strings.SplitSeq(logs.String(), "\n") {
			switch {
			case strings.Contains(line, "redis lost acknowledged writes"):
				lost = append(lost, line)
			case strings.Contains(line, "failed writes replayed"):
				replayed += field(line, "ids")
				batches += field(line, "batches")
			}
		}
		return len(lost) == 1 && replayed >= field(lost[0], "ids")+max(field(lost[0], "already_held"), 0)
	})
	if len(lost) != 1 {
		t.Fatalf("want one WARN of lost writes, got %d:\n%s", len(lost), logs.String())
	}
	ids, already := field(lost[0], "ids"), field(lost[0], "already_held")
	if replayed != ids+max(already, 0) || batches != 2 {
		t.Fatalf("the WARN says %d IDs (and %d already held), the replay's INFO lines %d replayed in %d batches, want 2:\n%s",
			ids, already, replayed, batches, logs.String())
	}
	writes, repeats, past := field(lost[0], "writes"), field(lost[0], "repeats"), field(lost[0], "past_capacity")
	if writes != distinct+twice || ids != distinct || repeats != twice || already != 0 || past != 0 {
		t.Fatalf("the WARN says writes=%d ids=%d repeats=%d already_held=%d past_capacity=%d; want %d, %d, %d, 0, 0:\n%s",
			writes, ids, repeats, already, past, distinct+twice, distinct, twice, lost[0])
	}
	if st := g.Stats(); st.WritesLost != uint64(writes) || st.Unwritten != 0 {
		t.Fatalf("Stats: WritesLost %d (the WARN's writes %d), Unwritten %d", st.WritesLost, writes, st.Unwritten)
	}
}
