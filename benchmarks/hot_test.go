package main

import (
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
	byRound := []map[string]HitResult{
		{"cacheguard": {OpsPerSec: 90}, "go-redis+autopipeline": {OpsPerSec: 100}},
		{"cacheguard": {OpsPerSec: 120}, "go-redis+autopipeline": {OpsPerSec: 100}},
		{"cacheguard": {OpsPerSec: 100}, "go-redis+autopipeline": {OpsPerSec: 100}},
	}
	h := HitResult{Contender: "cacheguard"}
	vsReference(&h, byRound)
	if h.Reference != "go-redis+autopipeline" || h.VsRef != 1.0 || !slices.Equal(h.VsRefRuns, []float64{0.9, 1.2, 1.0}) {
		t.Errorf("got %s %v %v, want go-redis+autopipeline, the median 1.00 of same-round ratios 0.9, 1.2, 1.0", h.Reference, h.VsRef, h.VsRefRuns)
	}
	raw := HitResult{Contender: "raw"}
	if vsReference(&raw, byRound); raw.Reference != "" {
		t.Errorf("raw has no reference, got %q", raw.Reference)
	}
	out := markdownHit(&Report{Hit: []HitResult{raw, h}})
	if !strings.Contains(out, "cacheguard against go-redis+autopipeline: 1.00× its ops/s (each round's: 0.90, 1.20, 1.00)") {
		t.Errorf("table 1 lacks the ratio to the reference:\n%s", out)
	}
}
