package main

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHotShapeCheck(t *testing.T) {
	for _, c := range []struct {
		contender string
		ttl, load time.Duration
		refused   string // a part of the error, or "" for none
	}{
		{"cacheguard+refresh", 200 * time.Millisecond, 20 * time.Millisecond, ""},
		{"rueidisaside", 200 * time.Millisecond, 20 * time.Millisecond, ""},
		{"raw", 1500 * time.Millisecond, 10 * time.Millisecond, ""},
		{"go-zero", 2 * time.Second, 20 * time.Millisecond, ""},
		{"go-redis/cache+local", time.Second, 20 * time.Millisecond, ""},
		{"go-zero+bloom", 1500 * time.Millisecond, 10 * time.Millisecond, "whole seconds"},
		{"go-redis/cache", 200 * time.Millisecond, 10 * time.Millisecond, "1-hour default"},
		{"go-redis/cache+local", 999 * time.Millisecond, 10 * time.Millisecond, "1-hour default"},
		{"cacheguard", 0, 10 * time.Millisecond, "positive"},
		{"cacheguard", time.Second, 0, "positive"},
	} {
		err := hotShape{ttl: c.ttl, load: c.load}.check(c.contender)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s, TTL %v, load %v: %v", c.contender, c.ttl, c.load, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s, TTL %v, load %v: err %v, want one saying %q", c.contender, c.ttl, c.load, err, c.refused)
		}
	}
}

func TestMarkdownHotNamesItsShape(t *testing.T) {
	rs := []HotKeyResult{{Contender: "cacheguard+refresh", TTL: 200 * time.Millisecond, LoadTime: 20 * time.Millisecond,
		GetsRuns: []int64{1}, MaxRuns: []time.Duration{time.Millisecond}}}
	out := markdownHot("4", rs, hotPauseDefault)
	for _, want := range []string{"TTL 200 ms, loader 20 ms", "| Gets ≥ 20 ms |", "| cacheguard+refresh |"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if out := markdownHot("4", []HotKeyResult{{Contender: "raw"}}, 0); !strings.Contains(out, "TTL 1 s, loader 10 ms") {
		t.Errorf("a row without its shape (an older report) should read as the defaults:\n%s", out)
	}
}

func TestMedianStale(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	runs := []StaleResult{{P50: ms(1), P99: ms(30), Max: ms(90)}, {P50: ms(2), P99: ms(10), Max: ms(20)}, {P50: ms(3), P99: ms(20), Max: ms(200)}}
	m := medianStale(runs)
	if m.P50 != ms(3) || m.P99 != ms(20) || m.Max != ms(90) {
		t.Errorf("median row p50 %v p99 %v max %v, want the median-p99 round's p50 (3ms), p99 20ms, max the median of maxes 90ms", m.P50, m.P99, m.Max)
	}
	if !slices.Equal(m.P99Runs, []time.Duration{ms(30), ms(10), ms(20)}) || !slices.Equal(m.MaxRuns, []time.Duration{ms(90), ms(20), ms(200)}) {
		t.Errorf("rounds kept in run order: p99 %v, max %v", m.P99Runs, m.MaxRuns)
	}
}

func TestVsReference(t *testing.T) {
	h := HitResult{Contender: "cacheguard"}
	vsReference(&h, []float64{0.9, 1.2, 1.0, 1.3})
	if h.Reference != "go-redis+autopipeline" || math.Abs(h.VsRef-math.Sqrt(1.2)) > 1e-9 || !slices.Equal(h.VsRefRuns, []float64{0.9, 1.2, 1.0, 1.3}) {
		t.Errorf("got %s %v %v, want go-redis+autopipeline, the median √(1.0·1.2) of pairs' ratios 0.9, 1.2, 1.0, 1.3", h.Reference, h.VsRef, h.VsRefRuns)
	}
	out := markdownHit(&Report{Hit: []HitResult{{Contender: "raw"}, h}})
	want := "cacheguard against go-redis+autopipeline, interleaved: 1.10× its ops/s (median of 4 pairs of 250ms slices, middle half 1.00 to 1.20)"
	if !strings.Contains(out, want) || strings.Contains(out, "raw against") {
		t.Errorf("table 1 lacks the ratio to the reference (or raw has one):\n%s", out)
	}
}

// TestAlternate: the order alternates, the first pair is dropped, and each
// ratio is a's over b's: a twice as fast as b on a machine slowing by a
// tenth at every slice gives ratios on both sides of 2, their median 2.
func TestAlternate(t *testing.T) {
	speed, order := 1.0, ""
	slice := func(name string, ops float64) func() (float64, error) {
		return func() (float64, error) {
			order += name
			speed *= 0.9
			return ops * speed, nil
		}
	}
	ratios, err := alternate(4, slice("a", 2), slice("b", 1))
	if err != nil {
		t.Fatal(err)
	}
	if order != "abbaabbaab" {
		t.Errorf("slices ran %s, want abbaabbaab", order)
	}
	if len(ratios) != 4 {
		t.Fatalf("%d ratios, want 4 (5 pairs, the first dropped): %v", len(ratios), ratios)
	}
	for i, r := range ratios {
		want := 2 / 0.9 // a ran first: b ran on a slower machine
		if i%2 == 0 {
			want = 2 * 0.9
		}
		if math.Abs(r-want) > 1e-9 {
			t.Errorf("pair %d: ratio %v, want %v (%v)", i+1, r, want, ratios)
		}
	}
	h := HitResult{Contender: "cacheguard"}
	if vsReference(&h, ratios); math.Abs(h.VsRef-2) > 1e-9 {
		t.Errorf("median %v of %v, want 2: the drift leans the AB and BA pairs opposite ways", h.VsRef, ratios)
	}
	boom := errors.New("boom")
	if _, err := alternate(2, slice("a", 2), func() (float64, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Errorf("a slice's error: got %v, want boom", err)
	}
}

// TestAbsence: on Redis's clock, an entry is absent from its expiry (one
// ms past its PEXPIRETIME) to its fill time, however late the probes
// around them ran; without a fill time, to the midpoint of the probes
// around its return. Probes every ms (µs below), an entry expiring at
// 10 ms: the probe that finds it back runs 5 ms after the refill.
func TestAbsence(t *testing.T) {
	ms := func(n int64) int64 { return n * 1000 }
	var a absence
	a.add(probe{at: ms(9), present: true, expiresMs: 10, filled: ms(1)})
	a.add(probe{at: ms(12), present: false, expiresMs: -2})
	a.add(probe{at: ms(20), present: false, expiresMs: -2})
	a.add(probe{at: ms(35), present: true, expiresMs: 130, filled: ms(30)}) // refilled at 30, found at 35
	a.add(probe{at: ms(109), present: true, expiresMs: 130, filled: ms(30)})
	if a.absent != ms(30-11) {
		t.Errorf("absent %d µs, want 19 ms: from 11 (expiry) to 30 (fill), not to 35 (the probe)", a.absent)
	}
	if got, want := a.share(), 19.0/100; math.Abs(got-want) > 1e-9 {
		t.Errorf("share %v, want %v (19 ms of the 100 from the first probe to the last)", got, want)
	}

	// No fill time (another library's entry): its return counts at the
	// midpoint of the probes around it; expired and refilled between two
	// probes that both found it, at the two Redis times.
	var b absence
	b.add(probe{at: ms(9), present: true, expiresMs: 10})
	b.add(probe{at: ms(14), present: false, expiresMs: -2})
	b.add(probe{at: ms(20), present: true, expiresMs: 200})
	if b.absent != ms(17-11) {
		t.Errorf("absent %d µs, want 6 ms: from 11 to 17, the midpoint of 14 and 20", b.absent)
	}
	var c absence
	c.add(probe{at: ms(9), present: true, expiresMs: 10, filled: ms(1)})
	c.add(probe{at: ms(40), present: true, expiresMs: 230, filled: ms(30)})
	if c.absent != ms(30-11) {
		t.Errorf("absent %d µs, want 19 ms: expired at 11 and refilled at 30, between two probes", c.absent)
	}

	// Deleted before its expiry, or an entry without a TTL (-1) deleted:
	// gone at the midpoint of the probes around it.
	for _, expiresMs := range []int64{500, -1} {
		var d absence
		d.add(probe{at: ms(9), present: true, expiresMs: expiresMs})
		d.add(probe{at: ms(13), present: false, expiresMs: -2})
		if d.absent != ms(2) {
			t.Errorf("PEXPIRETIME %d: absent %d µs, want 2 ms: from 11, the midpoint of 9 and 13", expiresMs, d.absent)
		}
	}
}
