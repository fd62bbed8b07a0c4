package pgfollow

import (
	"strconv"
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
