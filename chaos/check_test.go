package chaos

import (
	"strings"
	"testing"
	"time"
)

// ms is a time in the made-up histories below.
func ms(n int) int64 { return int64(n) * int64(time.Millisecond) }

func w(proc, id string, ver int64, exists bool, start, end int, lsn uint64, err string) Op {
	return Op{Proc: proc, Kind: Write, ID: id, Ver: ver, Exists: exists, Start: ms(start), End: ms(end), LSN: lsn, Err: err}
}

func r(proc, id string, ver int64, start, end int) Op {
	return Op{Proc: proc, Kind: Read, ID: id, Ver: ver, Start: ms(start), End: ms(end)}
}

var rules = Rules{Local: func(p string) bool { return strings.HasPrefix(p, "local") }, LocalWindow: time.Second, RepairWindow: time.Second,
	Reaction: 100 * time.Millisecond}

// TestCheck: each rule of the checker, with a history that breaks it and
// one that does not (the control of each is the line that fails it).
func TestCheck(t *testing.T) {
	tl := Timeline{Confirms: []Confirm{{At: ms(100), LSN: 10}, {At: ms(300), LSN: 20}}}
	v1, v5 := w("a", "k", 1, true, 0, 1, 0, ""), w("a", "k", 5, true, 10, 20, 0, "") // version 1, then 5 (returned at 20)
	cases := []struct {
		name    string
		history []Op
		kind    string // the violation, "" for none
	}{
		{"a read after a Set returned sees it",
			[]Op{v1, v5, r("b", "k", 5, 30, 31)}, ""},
		{"a read after a Set returned sees an older version",
			[]Op{v1, v5, r("b", "k", 1, 30, 31)}, StaleValue},
		{"a read that began before the Set returned may see the older one",
			[]Op{v1, v5, r("b", "k", 1, 15, 31)}, ""},
		{"a later version than known (a write whose process died)",
			[]Op{v5, r("b", "k", 9, 30, 31)}, ""},
		{"not found after a create returned",
			[]Op{v5, r("b", "k", NotFound, 30, 31)}, FalseNotFound},
		{"not found while a delete ran",
			[]Op{v5, w("a", "k", 6, false, 29, 40, 0, ""), r("b", "k", NotFound, 30, 31)}, ""},
		{"not found while a write of unknown outcome ran",
			[]Op{v5, {Proc: "a", Kind: Intent, ID: "k", Start: ms(29)}, r("b", "k", NotFound, 30, 31)}, ""},
		{"a value after a delete returned",
			[]Op{v5, w("a", "k", 6, false, 21, 22, 0, ""), r("b", "k", 5, 30, 31)}, ValueOfGone},
		{"a value after a TRUNCATE returned",
			[]Op{v5, w("sql", AllIDs, 6, false, 21, 22, 0, Outside), r("b", "k", 5, 400, 401)}, ""},
		{"a value after a TRUNCATE the follower confirmed",
			[]Op{v5, w("sql", AllIDs, 6, false, 21, 22, 15, Outside), r("b", "k", 5, 400, 401)}, ValueOfGone},
		{"an outside write before the follower confirmed it",
			[]Op{v1, w("sql", "k", 5, true, 10, 20, 15, Outside), r("b", "k", 1, 200, 201)}, ""},
		{"an outside write after the follower confirmed it",
			[]Op{v1, w("sql", "k", 5, true, 10, 20, 15, Outside), r("b", "k", 1, 301, 302)}, StaleValue},
		{"a failed Guard call counts from the follower's confirmation",
			[]Op{v1, w("a", "k", 5, true, 10, 20, 5, "unavailable"), r("b", "k", 1, 50, 51), r("b", "k", 1, 101, 102)}, StaleValue},
		{"a Local process within its window",
			[]Op{v1, v5, r("local1", "k", 1, 500, 501)}, ""},
		{"a Local process past its window",
			[]Op{v1, v5, r("local1", "k", 1, 1021, 1022)}, StaleValue},
		{"a Local process's own write",
			[]Op{w("local1", "k", 1, true, 0, 1, 0, ""), w("local1", "k", 5, true, 10, 20, 0, ""), r("local1", "k", 1, 30, 31)}, StaleValue},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := Check(c.history, tl, rules)
			got := ""
			for k, n := range rep.Violations {
				if n > 0 {
					got = k
				}
			}
			if got != c.kind || rep.Violated() > 1 {
				t.Fatalf("got %v, want %q\n%s", rep.Violations, c.kind, rep)
			}
		})
	}
}

// TestCheckRollback: a restart from an older dump takes back the writes
// after the dump until the repair window ends; the ones before it, and the
// ones after Redis answered again, still hold.
func TestCheckRollback(t *testing.T) {
	tl := Timeline{Faults: []Fault{{Kind: "old dump", Dump: ms(100), Start: ms(200), End: ms(300)}}}
	history := []Op{
		w("a", "k", 1, true, 0, 1, 0, ""),
		w("a", "k", 5, true, 110, 120, 0, ""), // after the dump: taken back
		r("b", "k", 1, 400, 401),              // in the window: allowed
		r("b", "k", 1, 1301, 1302),            // past it: stale
		w("a", "j", 1, true, 0, 1, 0, ""),
		w("a", "j", 5, true, 10, 20, 0, ""),   // before the dump: in it
		r("b", "j", 1, 400, 401),              // stale even in the window
		w("a", "n", 7, true, 310, 320, 0, ""), // a create after Redis answered
		r("b", "n", NotFound, 400, 401),       // false not-found even in the window
	}
	rep := Check(history, tl, rules)
	if rep.Violations[StaleValue] != 2 || rep.Violations[FalseNotFound] != 1 || rep.InRepairWindow != 1 {
		t.Fatalf("%v\n%s", rep.Violations, rep)
	}
}

// TestCheck503: a 503 counts against Redis only when every sample around
// it said Redis answered and the filter was ready.
func TestCheck503(t *testing.T) {
	tl := Timeline{Samples: []Sample{{At: ms(0), Up: true, Ready: true}, {At: ms(100), Up: true, Ready: true},
		{At: ms(200), Up: true, Ready: false}, {At: ms(300), Up: true, Ready: true}, {At: ms(400), Up: true, Ready: true}}}
	read := func(s, e int) Op { return Op{Proc: "a", Kind: Read, ID: "k", Start: ms(s), End: ms(e), Err: Err503} }
	rep := Check([]Op{read(10, 20), read(150, 160), read(310, 320), read(410, 420)}, tl, rules)
	if rep.Unavailable != 4 || rep.UnavailableRedisUp != 2 {
		t.Fatalf("%d 503s, %d with Redis up, want 4 and 2 (the one after the last sample is not judged)", rep.Unavailable, rep.UnavailableRedisUp)
	}
	// A fault that stopped Redis between two samples that saw it up.
	tl.Faults = []Fault{{Kind: "restart", Start: ms(305), End: ms(312), Redis: true}}
	if rep := Check([]Op{read(10, 20), read(310, 320)}, tl, rules); rep.UnavailableRedisUp != 1 {
		t.Fatalf("%d 503s with Redis up, want 1: the one during the restart is not", rep.UnavailableRedisUp)
	}
	// One within the Guards' reaction to Redis answering again (100 ms).
	tl.Faults = []Fault{{Kind: "restart", Start: ms(205), End: ms(290), Redis: true}}
	if rep := Check([]Op{read(10, 20), read(310, 320)}, tl, rules); rep.UnavailableRedisUp != 1 || rep.Reacting != 1 {
		t.Fatalf("%d 503s with Redis up, %d reacting, want 1 and 1", rep.UnavailableRedisUp, rep.Reacting)
	}
}

// TestRecorder: what a process records is read back, and a last line cut
// short is dropped.
func TestRecorder(t *testing.T) {
	path := t.TempDir() + "/h"
	rec, err := NewRecorder(path, "s0.1")
	if err != nil {
		t.Fatal(err)
	}
	rec.Record(Op{Kind: Read, ID: "k", Ver: 3, Start: 1, End: 2})
	rec.Record(Op{Kind: Write, ID: "k", Ver: 4, Exists: true, Start: 3, End: 4, LSN: 99})
	_, _ = rec.f.WriteString(`{"p":"s0.1","k":"r"`)
	_ = rec.Close()
	ops, err := ReadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[0].Proc != "s0.1" || ops[1].LSN != 99 || ops[1].Kind != Write {
		t.Fatalf("%+v", ops)
	}
}
