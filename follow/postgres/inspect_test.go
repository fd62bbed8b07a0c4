package pgfollow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pgfollow "github.com/cacheguard/cacheguard/follow/postgres"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// inspectAll checks every ID written, soon: the tests' inspector.
var inspectAll = pgfollow.Inspect{Rate: 1, Delays: []time.Duration{300 * time.Millisecond, 2 * time.Second}}

// totals sums the inspector's counts.
func totals(f *pgfollow.Follower) (checked, inconsistent, repaired uint64) {
	for _, i := range f.Stats().Inspections {
		checked, inconsistent, repaired = checked+i.Checked, inconsistent+i.Inconsistent, repaired+i.Repaired
	}
	return
}

// checkedAll waits until every sample of f was checked.
func checkedAll(t testing.TB, f *pgfollow.Follower) {
	t.Helper()
	waitFor(t, "the inspector's checks", func() bool { return pgfollow.InspectPending(f) == 0 })
}

// TestInspectorCleanRun: many changes of every kind, each ID read back at
// both delays, while readers in another process refill the entries as
// soon as the follower dropped them (filled after the write: never
// counted): 0 inconsistencies. Under -short a smaller run.
func TestInspectorCleanRun(t *testing.T) {
	t.Parallel()
	rows, rounds := 10_000, 10 // 100,000 UPDATEs, and INSERTs and DELETEs besides
	if testing.Short() {
		rows, rounds = 1_000, 2
	}
	fx := newOn(t, rows)
	fx.insp = inspectAll
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.warm(rows)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 { // readers: a Get of a random row, as fast as they go
		wg.Go(func() {
			for ctx.Err() == nil {
				id := fmt.Sprintf("id%d", rand.IntN(rows+rows/10))
				if _, err := guard.Get(ctx, fx.reader, id, fx.loadQuiet); err != nil && !isNotFound(err) && ctx.Err() == nil {
					t.Errorf("Get %s: %v", id, err)
					return
				}
			}
		})
	}
	round := 2 * (rows + 250) // the samples of a round's changes: each checked at both delays
	for r := range rounds {
		// A round starts once the inspector's queue has room for all of it
		// (a sample beyond the room is skipped, and the checks would fall short).
		waitFor(t, "room for a round in the inspector's queue", func() bool { return pgfollow.InspectPending(f)+round <= pgfollow.InspectRoom })
		fx.exec("UPDATE " + fx.name + " SET v = v + 1") // one transaction of rows changes
		fx.exec(fmt.Sprintf("DELETE FROM %s WHERE id IN (SELECT 'id' || i FROM generate_series(%d, %d) i)",
			fx.name, r*50, r*50+49)) // 50 deleted
		fx.exec(fmt.Sprintf("INSERT INTO %s SELECT 'new%d_' || i, 0 FROM generate_series(0, 99) i", fx.name, r)) // 100 created
		fx.burst(rows/2, 100, nil)                                                                               // 100 single-row transactions
		fx.caughtUp(f)
	}
	checkedAll(t, f)
	cancel()
	wg.Wait()
	checked, inconsistent, _ := totals(f)
	t.Logf("inspector, clean run: %d inconsistencies in %d checks (%d changes applied)", inconsistent, checked, f.Stats().Changes)
	if inconsistent != 0 {
		t.Fatalf("%d inconsistencies counted in a clean run (%+v)", inconsistent, f.Stats().Inspections)
	}
	if min := uint64(2 * rounds * rows); checked < min {
		t.Fatalf("%d checks, want at least %d (every ID written, at both delays)", checked, min)
	}
}

// loadQuiet is fx.load without its count (Gets run concurrently here).
func (fx *fixture) loadQuiet(ctx context.Context, id string) (int, error) {
	var v int
	err := fx.pool.QueryRow(ctx, "SELECT v FROM "+fx.name+" WHERE id = $1", id).Scan(&v)
	if err != nil && strings.Contains(err.Error(), "no rows") {
		return 0, guard.ErrNotFound
	}
	return v, err
}

func isNotFound(err error) bool { return err != nil && strings.Contains(err.Error(), "not found") }

// TestInspectorCountsInjected: staleness made behind the follower's back,
// after it applied the change, is counted at the delays, with the table
// and the ID: an entry written back to its bytes from before an UPDATE, a
// not-found marker restored after an INSERT, a filter rebuilt without an
// inserted ID. Control: the same injection with the inspector off counts
// nothing.
func TestInspectorCountsInjected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		off    bool
		inject func(fx *fixture, f *pgfollow.Follower) string // returns the ID made inconsistent
	}{
		{"written_back", false, writtenBack},
		{"marker_restored", false, markerRestored},
		{"filter_without", false, filterWithout},
		{"control_off", true, writtenBack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := newOn(t, 20)
			fx.insp = inspectAll
			if tc.off {
				fx.insp = pgfollow.Inspect{Rate: -1}
			}
			var l logs
			fx.log = slog.New(&l)
			f, _ := fx.follow(fx.guard(fx.rdb))
			fx.warm(20)
			fx.caughtUp(f)
			id := tc.inject(fx, f)
			injected := time.Now()
			if tc.off { // no inspector runs: nothing is queued, nothing can be counted later
				if ins, n := f.Stats().Inspections, pgfollow.InspectPending(f); ins != nil || n != 0 {
					t.Fatalf("inspector off: %+v and %d queued, want no counts and none", ins, n)
				}
				return
			}
			waitFor(t, "the inconsistency counted", func() bool { _, n, _ := totals(f); return n > 0 })
			took := time.Since(injected)
			checkedAll(t, f)
			checked, n, _ := totals(f)
			warned := l.find("inconsistent")
			t.Logf("%s: counted in %v (%d inconsistent of %d checks): %s", tc.name, took.Round(time.Millisecond), n, checked, warned)
			if !strings.Contains(warned, "table="+"public."+fx.name) || !strings.Contains(warned, "id="+id) {
				t.Fatalf("the WARN says %q: want table public.%s and id %s", warned, fx.name, id)
			}
		})
	}
}

// dump reads id's value key as DUMP does, and restore writes it back.
func (fx *fixture) dump(id string) string {
	fx.t.Helper()
	s, err := fx.rdb.Dump(context.Background(), fx.prefix+":item:{"+id+"}").Result()
	if err != nil {
		fx.t.Fatalf("DUMP %s: %v", id, err)
	}
	return s
}

func (fx *fixture) restore(id, dumped string) {
	fx.t.Helper()
	if err := fx.rdb.RestoreReplace(context.Background(), fx.prefix+":item:{"+id+"}", time.Minute, dumped).Err(); err != nil {
		fx.t.Fatalf("RESTORE %s: %v", id, err)
	}
}

// aged lets an entry become older than the inspector's allowance for
// Redis's clock (100 ms) before the change that makes it stale: a younger
// one is not judged (an entry is stale in production for longer).
func aged() {
	time.Sleep(200 * time.Millisecond) // a point in time, not a wait for a state
}

// writtenBack: id3 cached, UPDATEd; once the follower dropped its entry, the
// entry from before the UPDATE is written back (a stale write, a rollback).
func writtenBack(fx *fixture, f *pgfollow.Follower) string {
	old := fx.dump("id3")
	aged()
	fx.exec("UPDATE " + fx.name + " SET v = 7 WHERE id = 'id3'")
	fx.caughtUp(f)
	fx.restore("id3", old)
	if v, err := fx.get("id3"); err != nil || v != 0 {
		fx.t.Fatalf("the injection: Get id3 = %d, %v; want the stale 0", v, err)
	}
	return "id3"
}

// markerRestored: id4 deleted (its marker written), then inserted again;
// once the follower cleared the marker, it is written back.
func markerRestored(fx *fixture, f *pgfollow.Follower) string {
	fx.exec("DELETE FROM " + fx.name + " WHERE id = 'id4'")
	fx.caughtUp(f)
	if _, err := fx.get("id4"); !isNotFound(err) {
		fx.t.Fatalf("Get of a deleted row: %v, want not found", err)
	}
	marker := fx.dump("id4")
	aged()
	fx.exec("INSERT INTO " + fx.name + " VALUES ('id4', 1)")
	fx.caughtUp(f)
	fx.restore("id4", marker)
	return "id4"
}

// filterWithout: a new row; once the follower added it to the filter, the
// filter is rebuilt from a list without it.
func filterWithout(fx *fixture, f *pgfollow.Follower) string {
	fx.exec("INSERT INTO " + fx.name + " VALUES ('fresh', 1)")
	fx.caughtUp(f)
	ids := func(yield func(string, error) bool) {
		for i := range 20 {
			if !yield(fmt.Sprintf("id%d", i), nil) {
				return
			}
		}
	}
	g := fx.guard(redistest.Connect(fx.t))
	if _, err := g.Rebuild(context.Background(), ids, nil); err != nil {
		fx.t.Fatal(err)
	}
	return "fresh"
}

// find returns the first record whose message holds s, as text.
func (l *logs) find(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if strings.Contains(r.Message, s) {
			var b strings.Builder
			b.WriteString(r.Message)
			r.Attrs(func(a slog.Attr) bool {
				fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
				return true
			})
			return b.String()
		}
	}
	return ""
}

// TestInspectorRepairs: with Inspect.Repair, an entry written back after an
// UPDATE is invalidated as soon as it is found: the next Get answers the
// table's value, and the count of repairs says so.
func TestInspectorRepairs(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 20)
	fx.insp = inspectAll
	fx.insp.Repair = true
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.warm(20)
	fx.caughtUp(f)
	writtenBack(fx, f)
	waitFor(t, "the repair", func() bool { _, _, n := totals(f); return n > 0 })
	if v, err := fx.get("id3"); err != nil || v != 7 {
		t.Fatalf("Get id3 after the repair = %d, %v; want 7", v, err)
	}
}

// unwatched is a redis.Hook that fails a Guard's watcher's EXISTS of its
// marks without sending them (guard's touch): the watcher takes Redis for
// down and never notices a restart, so that only the follower would. No
// other command of a Guard's or the follower's is an EXISTS of a mark.
type unwatched struct{}

var errUnwatched = errors.New("test: the watcher's EXISTS not sent")

func (unwatched) DialHook(next redis.DialHook) redis.DialHook { return next }
func (unwatched) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); cmd.Name() == "exists" && len(a) > 1 && strings.Contains(fmt.Sprint(a[1]), ":mark:") {
			cmd.SetErr(errUnwatched)
			return errUnwatched
		}
		return next(ctx, cmd)
	}
}
func (unwatched) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestInspectorSeesRollback: Redis restarts from a dump taken before 50
// UPDATEs the follower applied, with the follower's repair and its Guard's
// replay of lost writes both off (each would mend it): the inspector counts
// every entry that came back, at a check made after the restart.
func TestInspectorSeesRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts Redis from a dump: make test")
	}
	t.Parallel()
	srv, rdb := redistest.Private(t)
	rdb.AddHook(unwatched{}) // the Guard's watcher would replay the lost writes
	readerRDB := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = readerRDB.Close() })
	fx := newFixture(t, os.Getenv(envPG), rdb, readerRDB, "inspect", rollbackRows)
	fx.insp = pgfollow.Inspect{Rate: 1, Delays: []time.Duration{time.Hour}} // checked when the test says (InspectNow)
	unrepair := hidePositions(rdb, fx)
	g := fx.guard(rdb)
	f, _ := fx.follow(g)
	fx.warm(rollbackRows)
	fx.caughtUp(f)
	aged()
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	unrepair.on.Store(true)
	fx.burst(0, updated, nil)
	fx.caughtUp(f)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	pgfollow.InspectNow(f)
	waitFor(t, "the checks", func() bool { c, _, _ := totals(f); return c >= updated })
	_, n, _ := totals(f)
	t.Logf("rollback, repair off: %d of %d updated rows counted inconsistent, by a check %v after Redis answered again", n, updated,
		time.Since(restarted).Round(time.Millisecond))
	if n != updated {
		t.Fatalf("%d inconsistencies counted, want %d (every UPDATE Redis lost)", n, updated)
	}
}

// TestInspectorRefillIsConsistent: the seam of TestInspectorCountsInjected's
// written_back, the other way: an entry refilled by a Get in another process
// right after the follower dropped it (filled after the write, from the
// table) is checked at both delays and never counted.
func TestInspectorRefillIsConsistent(t *testing.T) {
	t.Parallel()
	fx := newOn(t, 20)
	fx.insp = inspectAll
	f, _ := fx.follow(fx.guard(fx.rdb))
	fx.warm(20)
	fx.caughtUp(f)
	aged()
	fx.exec("UPDATE " + fx.name + " SET v = 7 WHERE id = 'id3'")
	fx.caughtUp(f)
	if v, err := fx.get("id3"); err != nil || v != 7 {
		t.Fatalf("Get id3 = %d, %v; want 7", v, err)
	}
	checkedAll(t, f)
	if checked, n, _ := totals(f); checked < 2 || n != 0 {
		t.Fatalf("%d inconsistent of %d checks, want 0 of at least 2", n, checked)
	}
}
