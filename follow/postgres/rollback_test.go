package pgfollow_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestRedisRollback: the follower applied UPDATEs, then Redis restarts from
// a dump taken before them, with no change streaming afterwards. The
// entries the UPDATEs invalidated come back with the old values; the
// follower finds its position in Redis behind the slot and repairs them
// within repairBound, whether it kept running (idle: its own check, the
// changes replayed from its memory), was restarted, or a standby took over
// (entries dropped, filter rebuilt). A flush while idle loses the filter
// (nothing is stale): the follower rebuilds it. Controls, the repair off:
// a restarted follower leaves every updated row stale (nothing else in any
// process remembers the changes); after a flush the filter stays lost.
func TestRedisRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts Redis from dumps: make test")
	}
	t.Parallel()
	for _, tc := range []struct {
		name     string
		repairOn bool
		during   func(rb *rollback) // runs around the crash
	}{
		{"idle follower", true, (*rollback).idle},
		{"restarted follower", true, (*rollback).restarted},
		{"standby takes over", true, (*rollback).standby},
		{"control: restarted follower, repair off", false, (*rollback).restarted},
		{"flush while idle", true, (*rollback).flushed},
		{"control: flush while idle, repair off", false, (*rollback).flushed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rb := newRollback(t)
			rb.repairOn = tc.repairOn
			tc.during(rb)
			repaired := "never"
			for time.Since(rb.answered) < 2*time.Second {
				if rb.fx.stale() == 0 {
					repaired = time.Since(rb.answered).Round(time.Millisecond).String()
					break
				}
			}
			at2, at5 := rb.staleAt(2*time.Second), rb.staleAt(repairBound)
			loaded := rb.unguarded()
			rb.refused()
			t.Logf("%s: stale rows after redis answered again: 0 within %s; %d at 2 s, %d at 5 s (of %d updated); "+
				"%d of %d unknown IDs loaded at 5 s", tc.name, repaired, at2, at5, updated, loaded, unknownIDs)
			switch {
			case !tc.repairOn && rb.flush && loaded < unknownIDs:
				t.Fatalf("control: %d of %d unknown IDs loaded at 5 s after a flush, repair off: want the filter lost", loaded, unknownIDs)
			case !tc.repairOn && !rb.flush && at5 < updated:
				t.Fatalf("control: %d stale rows at 5 s with the repair off, want all %d updated", at5, updated)
			case tc.repairOn && (at5 != 0 || loaded != 0):
				t.Fatalf("%d stale rows, %d of %d unknown IDs loaded at 5 s after redis answered again; want 0 and 0", at5, loaded, unknownIDs)
			}
		})
	}
}

// updated is how many rows change after the dump (of rollbackRows cached).
const updated, rollbackRows = 50, 200

// repairBound is how soon after Redis answers again the repair must be
// done: the follower's idle check runs every second, and the room is for a
// loaded machine (the figure within it is logged, not held).
const repairBound = 5 * time.Second

// rollback is one scenario: a fixture on a Redis of its own, a follower
// caught up, a dump, then updated rows applied and read by the reader.
type rollback struct {
	t        *testing.T
	srv      *redisserver.Server
	fx       *fixture
	f        *pgfollow.Follower
	g        *guard.Guard // the follower's: closed when it stops (a process's death)
	stop     func()
	answered time.Time        // when Redis answered again after the crash (or was flushed)
	repairOn bool             // the follower started after the crash repairs
	flush    bool             // Redis was flushed, not restarted from the dump
	unrepair *positionsHidden // on the followers' client (fol): a second follower has a client of its own
	fol      *redis.Client    // the followers' client, as the follower's user of docs/usage.md
}

// followerUser is the followers' Redis user (keyspace.ACLFollower).
const followerUser = "pgf"

// asFollower creates the followers' user on srv (again after a restart: an
// ACL SETUSER is not in a dump; a deployment has it in its ACL file) and
// returns a client logged in as it.
func (rb *rollback) asFollower() *redis.Client {
	rb.t.Helper()
	if err := redistest.SetUser(context.Background(), rb.admin(), followerUser, rb.fx.prefix, keyspace.ACLFollower); err != nil {
		rb.t.Fatal(err)
	}
	o := rb.srv.Options()
	o.Username, o.Password = followerUser, "secret"
	c := redis.NewClient(o)
	rb.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (rb *rollback) admin() *redis.Client { return rb.fx.rdb.(*redis.Client) }

// refused fails the test if Redis refused the followers' user a command
// since it (re)started.
func (rb *rollback) refused() {
	rb.t.Helper()
	if r, err := redistest.RefusedOn(context.Background(), rb.admin(), followerUser); err != nil || len(r) != 0 {
		rb.t.Fatalf("ACL LOG of the follower's user (keyspace.ACLFollower): %v, %v", r, err)
	}
}

func newRollback(t *testing.T) *rollback {
	srv, rdb := redistest.Private(t)
	readerRDB := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = readerRDB.Close() })
	fx := newFixture(t, os.Getenv(envPG), rdb, readerRDB, "rollback", rollbackRows)
	rb := &rollback{t: t, srv: srv, fx: fx}
	rb.fol = rb.asFollower()
	rb.g, rb.unrepair = fx.guard(rb.fol), hidePositions(rb.fol, fx)
	f, stop := fx.follow(rb.g)
	rb.f, rb.stop = f, func() { stop(); _ = rb.g.Close() }
	fx.warm(rollbackRows)
	fx.caughtUp(rb.f)
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	fx.burst(0, updated, nil)
	fx.caughtUp(rb.f)
	// Another reader caches the new values, and ends (a service restarted:
	// nothing of it remembers them); the fixture's reader, which stays, wrote
	// nothing after the dump, so its own Guard has nothing to repair.
	reader := fx.reader
	fx.reader = fx.guard(readerOn(t, srv))
	if n := fx.stale(); n != 0 {
		t.Fatalf("%d stale rows before the crash", n)
	}
	_ = fx.reader.Close()
	fx.reader = reader
	return rb
}

// crash SIGKILLs Redis and restarts it from the dump.
func (rb *rollback) crash() {
	rb.t.Helper()
	rb.refused()
	if err := rb.srv.Kill(); err != nil {
		rb.t.Fatal(err)
	}
	if err := rb.srv.Restart(context.Background()); err != nil {
		rb.t.Fatal(err)
	}
	rb.answered = time.Now()
	if err := redistest.SetUser(context.Background(), rb.admin(), followerUser, rb.fx.prefix, keyspace.ACLFollower); err != nil {
		rb.t.Fatal(err)
	}
}

// readerOn is a client of srv's of its own, closed when the test ends.
func readerOn(t *testing.T, srv *redisserver.Server) *redis.Client {
	c := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// within polls cond until repairBound after Redis answered again.
func (rb *rollback) within(what string, cond func() bool) {
	rb.t.Helper()
	waitUntil(rb.t, fmt.Sprintf("%s within %v of redis answering again", what, repairBound), rb.answered.Add(repairBound), cond)
}

// idle: the follower keeps running; no change comes after the crash. Its
// Guard's watcher is off and its confirmations find nothing: its idle
// check alone repairs. Rows not updated keep their entries (the repair
// replays, drops nothing).
func (rb *rollback) idle() {
	rb.unrepair.watchOff.Store(true)
	rb.unrepair.sets.Store(true)
	before := rb.f.Stats().Rollbacks // its first start counted one
	rb.crash()
	rb.within("the follower's repair", func() bool { return rb.f.Stats().Rollbacks > before })
	rb.unrepair.sets.Store(false)
	key := fmt.Sprintf("%s:item:{id%d}", rb.fx.prefix, rollbackRows-1)
	if n, err := rb.fx.rdb.Exists(context.Background(), key).Result(); err != nil || n != 1 {
		rb.t.Fatalf("the entry of a row not updated: exists %d, %v; want it kept by a replay", n, err)
	}
}

// restarted: the follower stops before the crash; a new one (a new
// process: a Guard and memory of its own) starts after it.
func (rb *rollback) restarted() {
	rb.stop()
	rb.crash()
	rb.unrepair.on.Store(!rb.repairOn)
	f, _ := rb.fx.followOn(rb.fx.url, rb.fx.guard(rb.fol))
	if rb.repairOn {
		rb.within("the new follower's repair", func() bool { return f.Stats().Rollbacks > 0 })
	}
}

// flushed: the follower keeps running, as in idle, and Redis is flushed
// (FLUSHALL): the entries, the filter and the position go. The follower's
// idle check finds no position: it drops and rebuilds (with the repair
// off, it takes the position for there).
func (rb *rollback) flushed() {
	rb.flush = true
	rb.unrepair.watchOff.Store(true)
	rb.unrepair.sets.Store(true)
	rb.unrepair.on.Store(!rb.repairOn)
	before := rb.f.Stats().Rollbacks
	if err := rb.fx.rdb.FlushAll(context.Background()).Err(); err != nil {
		rb.t.Fatal(err)
	}
	rb.answered = time.Now()
	if rb.repairOn {
		rb.within("the follower's repair", func() bool { return rb.f.Stats().Rollbacks > before })
		rb.unrepair.sets.Store(false)
	}
}

// standby: a second follower stands by; the first stops after the crash.
func (rb *rollback) standby() {
	own := rb.asFollower() // the positions stay visible to the second alone
	second, _ := rb.fx.followOn(rb.fx.url, rb.fx.guard(own))
	waitFor(rb.t, "the second to stand by", func() bool { return second.Stats().Standby })
	rb.unrepair.on.Store(true) // the first must not repair: the second takes over unrepaired
	rb.crash()
	rb.stop()
	rb.within("the second to take over", func() bool { return second.Stats().Following })
	rb.within("the second's repair", func() bool { return second.Stats().Rollbacks > 0 })
}

// positionsHidden is a redis.Hook that, while on, keeps the follower's
// position out of Redis without sending its commands: a read answers the
// highest position there is and a set succeeds. The follower then never
// finds Redis behind the slot: it repairs nothing (a follower without the
// repair, the control). No other command reads or sets that key. While
// sets, a set alone succeeds unsent: only a read (the check as a session
// starts, and every second while idle) can find Redis behind, not the
// compare-and-set of a confirmation (the server's pings make one whenever
// its WAL moves). While watchOff, it fails the EXISTS of a Guard's mark
// that its watcher sends (as guard's tests do): the watcher takes Redis
// for down and notices nothing Redis lost.
type positionsHidden struct {
	key      string
	on       atomic.Bool
	sets     atomic.Bool
	watchOff atomic.Bool
}

var errWatchOff = errors.New("test: the watcher's EXISTS not sent")

// hidePositions adds a positionsHidden, off, for fx's follower to rdb.
func hidePositions(rdb redis.UniversalClient, fx *fixture) *positionsHidden {
	h := &positionsHidden{key: fx.prefix + ":item:pos:pgfollow:" + fx.name}
	rdb.AddHook(h)
	return h
}

func (h *positionsHidden) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *positionsHidden) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if h.watchOff.Load() && cmd.Name() == "exists" && len(a) > 1 && strings.Contains(fmt.Sprint(a[1]), ":mark:") {
			cmd.SetErr(errWatchOff)
			return errWatchOff
		}
		gets := h.on.Load()
		if !gets && !h.sets.Load() {
			return next(ctx, cmd)
		}
		switch c := cmd.(type) {
		case *redis.StringCmd: // Position: GET key
			if gets && cmd.Name() == "get" && len(a) == 2 && a[1] == h.key {
				c.SetVal(strconv.FormatUint(math.MaxUint64, 10))
				return nil
			}
		case *redis.Cmd: // SetPosition: EVALSHA (or EVAL) sha 1 key from pos
			if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(a) > 3 && a[3] == h.key {
				c.SetVal("") // set
				return nil
			}
		}
		return next(ctx, cmd)
	}
}
func (h *positionsHidden) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// staleAt counts the stale rows at d after Redis answered again.
func (rb *rollback) staleAt(d time.Duration) int {
	time.Sleep(time.Until(rb.answered.Add(d))) // a point in time the figure is taken at, not a wait for a state
	return rb.fx.stale()
}

// unknownIDs is how many IDs no row has unguarded asks for.
const unknownIDs = 10

// unguarded counts the unknown IDs that reach the loader through a Guard
// that never saw the filter (no copy of it): all while the filter is lost
// and not rebuilt, none once it is.
func (rb *rollback) unguarded() int {
	g := rb.fx.guard(readerOn(rb.t, rb.srv))
	defer func() { _ = g.Close() }()
	loaded := 0
	for i := range unknownIDs {
		id := fmt.Sprintf("absent%d", i)
		if _, err := guard.Get(context.Background(), g, id, rb.fx.load); !errors.Is(err, guard.ErrNotFound) {
			rb.t.Fatalf("Get %s: %v, want ErrNotFound", id, err)
		}
		if n, ok := rb.fx.loads.LoadAndDelete(id); ok {
			loaded += int(*n.(*int64))
		}
	}
	return loaded
}

// TestSlotDropped: a slot dropped after a follower followed it is lost, as
// an invalidated one is: Run ends with ErrSlotLost (a Guard's Redis holds
// the follower's position), and Recover makes it anew. Control: a slot
// that no follower ever followed is missing set-up (ErrSetup).
func TestSlotDropped(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 10)
	run := func(g *guard.Guard) error {
		f, err := pgfollow.New(fx.url, fx.table(g), &pgfollow.Options{Slot: fx.name, Publication: fx.name})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, should Run retry
		defer cancel()
		return f.Run(ctx)
	}
	g := fx.guard(fx.rdb)
	waitFor(t, "the slot to be dropped", func() bool { return pgfollow.DropSlot(context.Background(), fx.url, fx.name) == nil })
	if err := run(g); !errors.Is(err, pgfollow.ErrSetup) {
		t.Fatalf("Run on a slot never followed, dropped: %v; want ErrSetup", err)
	}
	if err := pgfollow.Setup(context.Background(), fx.url, &pgfollow.Options{Slot: fx.name, Publication: fx.name}, fx.name); err != nil {
		t.Fatal(err)
	}
	_, stop := fx.follow(g)
	stop()
	waitFor(t, "the slot to be dropped", func() bool { return pgfollow.DropSlot(context.Background(), fx.url, fx.name) == nil })
	err := run(g)
	if !errors.Is(err, pgfollow.ErrSlotLost) || !strings.Contains(err.Error(), "dropped") {
		t.Fatalf("Run on a followed slot, dropped: %v; want ErrSlotLost saying it was dropped", err)
	}
	f, err := pgfollow.New(fx.url, fx.table(g), &pgfollow.Options{Slot: fx.name, Publication: fx.name})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	f2, _ := fx.follow(g)
	fx.warm(10)
	fx.exec("UPDATE " + fx.name + " SET v = 5 WHERE id = 'id1'")
	fx.caughtUp(f2)
	if n := fx.stale(); n != 0 || f2.Stats().Rollbacks != 0 {
		t.Fatalf("after Recover: %d rows stale, %d rollbacks (Recover set the positions: want none)", n, f2.Stats().Rollbacks)
	}
}

// TestRedisRollbackOnACluster: TestRedisRollback's restarted follower and
// standby (which took over before the crash, remembering none of the
// changes) on a 3-master Redis Cluster, the rollback on a master that does
// not hold the slot where a single position key would live (the one a
// follower saw before each master kept a copy: it found nothing behind and
// left the rows stale). The master restarts from a dump taken before the
// UPDATEs; a restarted follower, or a standby taking over, must find its
// copy of the position behind and repair every updated row within
// repairBound. Control (run by hand): with the one key of before, both
// cases time out with the rows stale.
func TestRedisRollbackOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster and restarts a master from a dump: make test")
	}
	t.Parallel()
	for _, standby := range []bool{false, true} {
		name := map[bool]string{false: "restarted follower", true: "standby takes over"}[standby]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cl, err := redisserver.StartCluster(ctx, 3, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Stop)
			client := func() *redis.ClusterClient {
				c := redis.NewClusterClient(cl.Options())
				t.Cleanup(func() { _ = c.Close() })
				return c
			}
			rdb := client()
			fx := newFixture(t, os.Getenv(envPG), rdb, client(), "rollback", rollbackRows)
			g := fx.guard(rdb)
			f, stop := fx.follow(g)
			var second *pgfollow.Follower
			if standby {
				second, _ = fx.followOn(fx.url, fx.guard(client()))
				waitFor(t, "the second to stand by", func() bool { return second.Stats().Standby })
			}
			fx.warm(rollbackRows)
			fx.caughtUp(f)
			if err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Save(ctx).Err() }); err != nil {
				t.Fatal(err)
			}
			fx.burst(0, updated, nil)
			fx.caughtUp(f)
			reader := fx.reader // another reader caches the new values, and ends
			fx.reader = fx.guard(client())
			if n := fx.stale(); n != 0 {
				t.Fatalf("%d stale rows before the crash", n)
			}
			_ = fx.reader.Close()
			fx.reader = reader
			// The master to restart: one an updated row lives on, and not
			// the one a single position key would be on.
			single, err := rdb.MasterForKey(ctx, fx.prefix+":item:pos:pgfollow:"+fx.name)
			if err != nil {
				t.Fatal(err)
			}
			var victim *redisserver.Server
			for i := range updated {
				m, err := rdb.MasterForKey(ctx, fmt.Sprintf("%s:item:{id%d}", fx.prefix, i))
				if err != nil {
					t.Fatal(err)
				}
				if a := m.Options().Addr; a != single.Options().Addr {
					victim = cl.Nodes[slices.IndexFunc(cl.Nodes, func(s *redisserver.Server) bool { return s.Addr == a })]
					break
				}
			}
			stop() // the first follower ends (its process dies) before the crash
			_ = g.Close()
			if standby { // the standby took over: it remembers none of the UPDATEs
				waitFor(t, "the standby to take over", func() bool { return second.Stats().Following })
			}
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := victim.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			if err := cl.WaitHealthy(ctx, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			answered := time.Now()
			if !standby { // the rollback made rows stale: nothing has repaired them yet
				if n := fx.stale(); n == 0 {
					t.Fatal("no stale row after the master restarted from its dump: the test proves nothing")
				}
				second, _ = fx.followOn(fx.url, fx.guard(client()))
			}
			waitUntil(t, "the rows the restarted master held stale to be repaired", answered.Add(repairBound), func() bool {
				return second.Stats().Rollbacks > 0 && fx.stale() == 0
			})
			t.Logf("%s: 0 stale rows %v after the master answered again", name, time.Since(answered).Round(time.Millisecond))
		})
	}
}
