package adaptertest

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// frozenRedisIsBounded: with the README's client and Redis frozen
// (SIGSTOP) for 5 s, requests without a deadline are answered within the
// middleware's 100 ms plus the handler's own time, not when Redis resumes:
// a known ID by the handler, from the database (its Get loads through at
// once), an unknown one by the middleware (the filter's copy: 503).
// RedisTimeout is set past the freeze, so a middleware that waited for it
// would answer after Redis resumed; the times are logged.
func frozenRedisIsBounded(t *testing.T, f Framework) {
	if testing.Short() {
		t.Skip("freezes Redis for 5 s")
	}
	srv, _ := redistest.Private(t)
	o := srv.Options()
	o.ContextTimeoutEnabled, o.DialerRetries, o.MaxRetries = true, 1, -1 // the README's client
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	var logs redistest.Logs
	opts := defaults("frozen")
	opts.Tuning.RedisTimeout = 10 * time.Second // past the freeze: only the middleware's own bound can answer in time
	a := newApp(t, f, rdb, opts, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	a.deadline = 500 * time.Millisecond // the README's handler
	// The Guard's first Get: from now on Peek reads the entry.
	if rec := get(a, "/products/1"); rec.Code != 200 {
		t.Fatalf("known ID before the freeze: %d", rec.Code)
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(srv.PID(), syscall.SIGCONT) })
	type kind struct {
		mu       sync.Mutex
		slowest  time.Duration
		statuses map[int]int
	}
	known, unknown := &kind{statuses: map[int]int{}}, &kind{statuses: map[int]int{}}
	ran := a.ran.Load()
	end := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				k, path := known, "/products/1"
				if (w+i)%2 == 1 {
					k, path = unknown, fmt.Sprintf("/products/x%d", i)
				}
				start := time.Now()
				rec := get(a, path)
				took := time.Since(start)
				k.mu.Lock()
				k.slowest = max(k.slowest, took)
				k.statuses[rec.Code]++
				k.mu.Unlock()
				time.Sleep(5 * time.Millisecond) // traffic, not a CPU-bound flood
			}
		})
	}
	wg.Wait()
	t.Logf("Redis frozen 5 s, handler deadline 500ms: known ID slowest %v statuses %v; unknown ID slowest %v statuses %v; handler ran %d",
		known.slowest, known.statuses, unknown.slowest, unknown.statuses, a.ran.Load()-ran)
	const limit = 2 * time.Second // 100 ms + the handler's 500 ms, with room for a loaded machine; under the 5 s freeze
	if known.slowest > limit || unknown.slowest > limit {
		t.Errorf("a request took %v (known) / %v (unknown) with Redis frozen; want each within %v", known.slowest, unknown.slowest, limit)
	}
	if known.statuses[200] == 0 || len(known.statuses) != 1 || a.ran.Load()-ran < int64(known.statuses[200]) {
		t.Errorf("known ID with Redis frozen: statuses %v, handler ran %d; want every one passed on and served 200 from the database",
			known.statuses, a.ran.Load()-ran)
	}
	if unknown.statuses[503]+unknown.statuses[404] != sumOf(unknown.statuses) || sumOf(unknown.statuses) == 0 {
		t.Errorf("unknown ID with Redis frozen: statuses %v; want 503 (the copy has not seen it) or 404", unknown.statuses)
	}
	if st := a.g.Stats(); st.RedisErrors == 0 || !strings.Contains(logs.String(), "passing through") {
		t.Errorf("the requests passed on were not counted (RedisErrors %d) or logged:\n%s", st.RedisErrors, logs.String())
	}
}

func sumOf(m map[int]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

// unconfirmedIs503: with Redis down, an ID the Guard's copy of the filter
// has never seen is answered 503 with Retry-After by the middleware, fail
// open or not, and neither the handler nor the loader runs; a known ID is
// served. The control, without the copy (NoLocalCopy), hands the unknown
// ID to the handler, whose Get loads it (404), as before.
func unconfirmedIs503(t *testing.T, f Framework) {
	srv, rdb := redistest.Private(t)
	withCopy := newApp(t, f, rdb, defaults("copy"), Config{RetryAfter: 3 * time.Second})
	off := defaults("off")
	off.Filter.NoLocalCopy = true
	without := newApp(t, f, rdb, off, Config{})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	rec := get(withCopy, "/products/999")
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "3" || withCopy.ran.Load() != 0 || withCopy.loads.Load() != 0 {
		t.Fatalf("unknown ID: %d, Retry-After %q, handler ran %d, loads %d; want 503, 3, 0, 0",
			rec.Code, rec.Header().Get("Retry-After"), withCopy.ran.Load(), withCopy.loads.Load())
	}
	if rec := get(withCopy, "/products/1"); rec.Code != 200 || rec.Body.String() != "lamp" {
		t.Fatalf("known ID: %d %s", rec.Code, rec.Body)
	}
	if rec := get(without, "/products/999"); rec.Code != 404 || without.loads.Load() != 1 {
		t.Fatalf("without the copy: %d, %d loads; want 404 from a load", rec.Code, without.loads.Load())
	}
}

type product struct{ ID, Name string }

// app is a router over a Guard whose filter holds "1" and "3" (3 is in the
// filter but no longer in the database).
type app struct {
	Router
	g     *guard.Guard
	loads atomic.Int64
	ran   atomic.Int64  // handler runs
	slow  chan struct{} // if set, the load waits for it to close
	// deadline, if set before the first request, is the handler's: its
	// Get runs under context.WithTimeout(r.Context(), deadline).
	deadline time.Duration
}
