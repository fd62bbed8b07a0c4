package main

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"math"
	"net/http"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The live dashboard (/dashboard): a sampler turns the shop's counters into
// points every sampleEvery (DB queries/s, Redis commands/s and p99 latency
// for each read path, the product Guard's rejects and markers per second),
// and the page, served from assets embedded in the binary (no CDN), polls
// /dashboard/points and draws them.

//go:embed dashboard
var dashboardFiles embed.FS

const (
	sampleEvery = 500 * time.Millisecond
	keepPoints  = 1200 // ten minutes
)

// point is one sample: rates over the interval before T.
type point struct {
	Seq     int64                `json:"seq"`
	T       int64                `json:"t"` // unix milliseconds
	Phase   string               `json:"phase,omitempty"`
	Paths   map[string]pathPoint `json:"paths"`
	Rejects float64              `json:"rejects"` // product Guard, per second
	Markers float64              `json:"markers"` // product Guard, per second
}

type pathPoint struct {
	DBPerSec    float64 `json:"db"`
	RedisPerSec float64 `json:"redis"`
	ReqPerSec   float64 `json:"req"`
	P99Ms       float64 `json:"p99"`
}

// live owns the sampler's state. Its goroutine is started by newLive and
// ends when stop is called (Shop.Close).
type live struct {
	lat sync.Map // path -> *latencies: written by every timed request, drained by each sample

	mu      sync.Mutex // guards the fields below
	phase   string
	before  string    // the phase at the last sample, when it changed since
	changed time.Time // when the phase first changed since the last sample
	points  []point
	seq     int64
	extra   map[string]func() (db, redis int64) // attached paths (attach)

	stopOnce sync.Once
	stop     chan struct{}
	stopped  chan struct{}
}

// counts is what the sampler reads from the shop at each tick.
type counts struct {
	db, redis        map[string]int64
	rejects, markers uint64
}

func newLive(read func() counts) *live {
	l := &live{stop: make(chan struct{}), stopped: make(chan struct{})}
	go l.run(read)
	return l
}

func (l *live) run(read func() counts) {
	defer close(l.stopped)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	prev, prevT := l.read(read), time.Now()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			cur := l.read(read)
			l.sample(prev, cur, now.Sub(prevT).Seconds(), now)
			prev, prevT = cur, now
		}
	}
}

// read returns the shop's counts and those of the attached paths.
func (l *live) read(shop func() counts) counts {
	c := shop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, f := range l.extra {
		c.db[name], c.redis[name] = f()
	}
	return c
}

// attach charts the guarded path of another shop (the outside-writes
// scenario's) as path name until detach is called. Its own sampler is
// stopped: l drains its latencies from then on.
func (l *live) attach(name string, s *Shop) (detach func()) {
	s.live.close()
	l.lat.Store(name, s.live.latencies("guard"))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.extra == nil {
		l.extra = map[string]func() (int64, int64){}
	}
	l.extra[name] = func() (int64, int64) { return s.store.queries.Load(), s.guardCmds.Commands() }
	return func() {
		l.mu.Lock()
		delete(l.extra, name)
		l.mu.Unlock()
	}
}

func (l *live) sample(prev, cur counts, secs float64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	// The interval is named by the phase it spent the longer part in.
	phase := l.phase
	if !l.changed.IsZero() && now.Sub(l.changed) < time.Duration(secs*float64(time.Second))/2 {
		phase = l.before
	}
	l.changed = time.Time{}
	p := point{Seq: l.seq, T: now.UnixMilli(), Phase: phase, Paths: map[string]pathPoint{},
		Rejects: float64(cur.rejects-prev.rejects) / secs, Markers: float64(cur.markers-prev.markers) / secs}
	for path := range cur.db {
		if _, ok := prev.db[path]; !ok {
			continue // attached since the last tick: no interval to rate yet
		}
		n, p99 := l.latencies(path).drain()
		p.Paths[path] = pathPoint{DBPerSec: float64(cur.db[path]-prev.db[path]) / secs,
			RedisPerSec: float64(cur.redis[path]-prev.redis[path]) / secs, ReqPerSec: float64(n) / secs,
			P99Ms: float64(p99.Microseconds()) / 1000}
	}
	l.points = append(l.points, p)
	if len(l.points) > keepPoints {
		l.points = slices.Delete(l.points, 0, len(l.points)-keepPoints)
	}
}

func (l *live) close() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.stopped
}

// setPhase names what the demo is doing (shown on the charts).
func (l *live) setPhase(s string) {
	l.mu.Lock()
	if l.changed.IsZero() {
		l.before, l.changed = l.phase, time.Now()
	}
	l.phase = s
	l.mu.Unlock()
}

// latencies is a histogram of request latencies with buckets 10% apart
// from 10 µs to about 2 minutes: a request adds to one bucket with one
// atomic add (no lock on the request path); the p99 it gives is within a
// bucket's width.
type latencies struct {
	b [latBuckets]atomic.Uint64
}

const (
	latBuckets = 172 // 10 µs × 1.1^171 ≈ 120 s
	latFirst   = 10 * time.Microsecond
)

var latGrowth = math.Log(1.1)

func (h *latencies) add(d time.Duration) {
	i := 0
	if d > latFirst {
		i = min(int(math.Log(float64(d)/float64(latFirst))/latGrowth)+1, latBuckets-1)
	}
	h.b[i].Add(1)
}

// drain empties the histogram and returns its count and p99 (the upper
// edge of the p99's bucket).
func (h *latencies) drain() (n uint64, p99 time.Duration) {
	var counts [latBuckets]uint64
	for i := range h.b {
		counts[i] = h.b[i].Swap(0)
		n += counts[i]
	}
	if n == 0 {
		return 0, 0
	}
	rank, seen := n-n/100, uint64(0) // the 99th percentile's rank (1-based)
	for i, c := range counts {
		if seen += c; seen >= rank {
			return n, time.Duration(float64(latFirst) * math.Pow(1.1, float64(i)))
		}
	}
	return n, 0
}

func (l *live) latencies(path string) *latencies {
	if h, ok := l.lat.Load(path); ok {
		return h.(*latencies)
	}
	h, _ := l.lat.LoadOrStore(path, &latencies{})
	return h.(*latencies)
}

// observe records one request's latency on path.
func (l *live) observe(path string, d time.Duration) { l.latencies(path).add(d) }

// timed wraps h: GETs of the read paths are timed for the p99 charts.
func (l *live) timed(h http.Handler, prefixes map[string]string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		for prefix, path := range prefixes {
			if strings.HasPrefix(r.URL.Path, prefix) {
				start := time.Now()
				// Labelled, so a -cpuprofile splits by path:
				// go tool pprof -tagfocus path=guard bin/shop cpu.prof
				pprof.Do(r.Context(), pprof.Labels("path", path), func(context.Context) { h.ServeHTTP(w, r) })
				l.observe(path, time.Since(start))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// handler serves the page and its points (GET /dashboard/points?after=seq).
func (l *live) handler() http.Handler {
	static, _ := fs.Sub(dashboardFiles, "dashboard")
	mux := http.NewServeMux()
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard/", http.FileServerFS(static)))
	mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/", http.StatusFound)
	})
	mux.HandleFunc("GET /dashboard/points", func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
		l.mu.Lock()
		i, _ := slices.BinarySearchFunc(l.points, after+1, func(p point, seq int64) int { return int(p.Seq - seq) })
		out := slices.Clone(l.points[i:])
		l.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(out)
	})
	return mux
}
