package pgfollow

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/feed"
)

// TestJudge: the inspector's rule on what Redis held, with Redis's clock an
// hour off the process's (only differences on each clock count). An entry
// refilled just after the write is never counted, even when checked long
// after; each case that counts has a twin that must not, and the naive
// rule (filled before the check less the delay) is shown to count a refill
// the real rule leaves alone.
func TestJudge(t *testing.T) {
	in, err := newInspector(Inspect{Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	tbl := &Table{Name: "public.t"}
	began := time.Now()
	read := began.Add(2 * time.Second)                       // the reply came 2 s after the batch began
	redisNow := began.Add(time.Hour + 1990*time.Millisecond) // Redis's clock, an hour ahead, at the check
	write := redisNow.Add(-1900 * time.Millisecond)          // when the write ran, on Redis's clock
	sample := func(st final) sample {
		return sample{written: written{t: tbl, id: "a", st: st}, delay: time.Second, began: began}
	}
	update, del, insert := final{changed: true}, final{changed: true, gone: true}, final{inserted: true}
	for _, tc := range []struct {
		name string
		st   final
		h    feed.Held
		bad  bool
	}{
		{"updated: entry filled before the write", update, feed.Held{Filled: write.Add(-time.Second), Values: 1, Admitted: true}, true},
		{"updated: entry refilled 5 ms after the write", update, feed.Held{Filled: write.Add(5 * time.Millisecond), Values: 1, Admitted: true}, false},
		{"updated: marker filled before the write", update, feed.Held{Filled: write.Add(-time.Second), Markers: 1, Admitted: true}, true},
		{"updated: entry of unknown fill time", update, feed.Held{Values: 1, Admitted: true}, false},
		{"updated: no entry", update, feed.Held{Admitted: true}, false},
		{"deleted: value filled before the write", del, feed.Held{Filled: write.Add(-time.Second), Values: 1, Admitted: true}, true},
		{"deleted: the write's marker", del, feed.Held{Filled: write, Markers: 1, Admitted: true}, false},
		{"inserted: marker filled before the write", insert, feed.Held{Filled: write.Add(-time.Second), Markers: 1, Admitted: true}, true},
		{"inserted: value filled before the write (Set by the service)", insert, feed.Held{Filled: write.Add(-time.Second), Values: 1, Admitted: true}, false},
		{"inserted: not admitted", insert, feed.Held{}, true},
		{"inserted: admitted", insert, feed.Held{Admitted: true}, false},
	} {
		tc.h.Now = redisNow
		if got := in.judge(sample(tc.st), tc.h, read) != ""; got != tc.bad {
			t.Errorf("%s: inconsistent %v, want %v (%q)", tc.name, got, tc.bad, in.judge(sample(tc.st), tc.h, read))
		}
	}
	// The naive rule would count the refill: the case tells the rules apart.
	refill := write.Add(5 * time.Millisecond)
	if naive := refill.Before(redisNow.Add(-time.Second)); !naive {
		t.Fatal("the refill case does not tell the naive rule from the inspector's")
	}
	// Superseded: an inserted ID written again, or its table reset, since.
	in.watched[idOf{tbl, "a"}] = &watch{batch: 2}
	if got := in.judge(sample(insert), feed.Held{Now: redisNow}, read); got != "" {
		t.Errorf("inserted, written again since, not admitted: %q, want nothing", got)
	}
}

// TestInspectorQueueBound: samples stop at inspectPending (said once, so the
// follower warns once per filling), and the IDs past it are not sampled.
func TestInspectorQueueBound(t *testing.T) {
	in, err := newInspector(Inspect{Rate: 1}) // two delays: two samples an ID
	if err != nil {
		t.Fatal(err)
	}
	tbl := &Table{Name: "public.t"}
	batch := func(n int) []written {
		ws := make([]written, n)
		for i := range ws {
			ws[i] = written{t: tbl, id: "id" + strconv.Itoa(i), st: final{changed: true}}
		}
		return ws
	}
	if !in.landed(batch(inspectPending), time.Now()) {
		t.Fatal("the queue filled and landed did not say so")
	}
	if n := in.pending(); n != inspectPending {
		t.Fatalf("%d samples queued, want %d", n, inspectPending)
	}
	if in.landed(batch(10), time.Now()) {
		t.Fatal("landed said the queue filled twice in one filling")
	}
	if n := in.pending(); n != inspectPending {
		t.Fatalf("%d samples queued after more IDs, want %d", n, inspectPending)
	}
}

// TestNinesMoveWithTheFirstInconsistency: the figure at 0, 1 and 20
// inconsistencies in 4,000 checks. None found gives no figure (NaN) and a
// bound of log10(4000) = 3.60; the first one found gives 3.60 nines, the
// twentieth 2.30: each inconsistency moves it. No figure before a check.
func TestNinesMoveWithTheFirstInconsistency(t *testing.T) {
	none := Inspection{Checked: 4000}
	one := Inspection{Checked: 4000, Inconsistent: 1}
	twenty := Inspection{Checked: 4000, Inconsistent: 20}
	round := func(f float64) float64 { return math.Round(f*100) / 100 }
	switch {
	case !math.IsNaN(none.Nines()) || round(none.AtLeast()) != 3.6:
		t.Fatalf("none found: Nines %v, AtLeast %v; want NaN and 3.6", none.Nines(), none.AtLeast())
	case round(one.Nines()) != 3.6 || round(twenty.Nines()) != 2.3:
		t.Fatalf("1 found: %v nines, 20 found: %v; want 3.6 and 2.3", one.Nines(), twenty.Nines())
	case !math.IsNaN(Inspection{}.Nines()) || Inspection{}.AtLeast() != 0:
		t.Fatalf("before any check: %v, %v", Inspection{}.Nines(), Inspection{}.AtLeast())
	}
}

// TestInspectorNamesEveryID: a burst of 25 inconsistencies in one table and
// one in another. The WARNs are paced per table (one for each table, not
// one in all), and Stats lists the last 20 IDs of the first table and the
// other's, so an operator finds every one the WARNs did not name.
func TestInspectorNamesEveryID(t *testing.T) {
	in, err := newInspector(Inspect{Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	f := &Follower{insp: in, log: slog.New(slog.NewTextHandler(&logs, nil))}
	a, b := &Table{Name: "public.a"}, &Table{Name: "public.b"}
	var due []sample
	var idx []int
	var found []string
	for i := range 26 {
		s := sample{written: written{t: a, id: "a" + strconv.Itoa(i), st: final{changed: true}}, delay: time.Second}
		if i == 25 {
			s.t, s.id = b, "b0"
		}
		due, idx, found = append(due, s), append(idx, i), append(found, "a value filled before the change")
		f.inconsistent(context.Background(), s, found[i])
	}
	in.taken = len(idx)
	in.done(due, idx, found)
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 || !strings.Contains(logs.String(), "table=public.b") {
		t.Fatalf("%d WARN lines, want one per table:\n%s", n, logs.String())
	}
	got := map[string][]string{}
	for _, c := range in.inspections() {
		got[c.Table] = c.Recent
	}
	if len(got["public.a"]) != inspectRecent || got["public.a"][0] != "a5" || got["public.a"][19] != "a24" ||
		len(got["public.b"]) != 1 || got["public.b"][0] != "b0" {
		t.Fatalf("Recent: %v", got)
	}
}
