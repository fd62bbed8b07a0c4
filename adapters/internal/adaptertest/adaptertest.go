// Package adaptertest is the test suite every HTTP adapter passes
// (adapters/nethttp, adapters/echo, adapters/echov5, adapters/gin): the same
// requests, the same answers. Each adapter's tests give it a Framework that
// builds a router with that adapter; the suite does the rest against a real
// redis-server.
package adaptertest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// Config is a middleware configuration in neutral terms; a Framework maps
// it to its adapter's Config (zero fields: the adapter's defaults).
type Config struct {
	FailClosed bool
	RetryAfter time.Duration
	// Logger is the Guard's (guard.Options.Logger): the adapters log
	// through it.
	Logger       *slog.Logger
	OnUnfiltered func(route string)
	// SkipHeader: requests that carry this header skip the middleware
	// (the adapter's Skipper).
	SkipHeader string
}

// Framework builds routers with one adapter.
type Framework interface {
	// New returns a router whose error handler is the adapter's, serving
	// GET /products/:id behind the middleware (cfg, guarding with g); the
	// handler answers get's string with 200, or get's error through the
	// adapter's HTTPError.
	New(g *guard.Guard, cfg Config, get func(r *http.Request, id string) (string, error)) Router
}

// Router is a Framework's router.
type Router interface {
	http.Handler
	// OK registers GET path (Echo syntax: "/items/:sku"; a Framework
	// translates it) behind a middleware with cfg on g; its handler answers
	// 200 with no body.
	OK(path string, g *guard.Guard, cfg Config)
}

// Run runs the suite. The cases with a redis-server of their own (they
// kill, freeze or restart it) run side by side.
func Run(t *testing.T, f Framework) {
	own := func(fn func(*testing.T, Framework)) func(*testing.T) {
		return func(t *testing.T) { t.Parallel(); fn(t, f) }
	}
	t.Run("UnknownKnownMalformed", func(t *testing.T) { unknownKnownMalformed(t, f) })
	t.Run("SkipperAndRedisDown", own(skipperAndRedisDown))
	t.Run("RetryAfterIsTheConfiguredValue", own(retryAfterIsTheConfiguredValue))
	t.Run("UnfilteredRouteIsReported", func(t *testing.T) { unfilteredRouteIsReported(t, f) })
	t.Run("ClientThatLeftIsNotAnOutage", func(t *testing.T) { clientThatLeftIsNotAnOutage(t, f) })
	t.Run("OutageLogsAFewLines", own(outageLogsAFewLines))
	t.Run("DeadlineIs503", func(t *testing.T) { deadlineIs503(t, f) })
	t.Run("UnconfirmedIs503", own(unconfirmedIs503))
	t.Run("FrozenRedisIsBounded", own(frozenRedisIsBounded))
	t.Run("ErrorAnswersAreGolden", own(errorAnswersAreGolden))
}

// errorAnswersAreGolden: every adapter answers 400, 404 and 503 with the
// same bytes, the middleware's answers and the handler's alike: status,
// the headers as the adapter wrote them (no more, no fewer) and body.
func errorAnswersAreGolden(t *testing.T, f Framework) {
	type answer struct {
		status  int
		headers string // sorted "Name: value" lines
		body    string
	}
	golden := func(status int, body string) answer {
		h := "Content-Length: " + fmt.Sprint(len(body)) + "\nContent-Type: application/problem+json\n"
		if status == 503 {
			h += "Retry-After: 2\n"
		}
		return answer{status, h + "X-Content-Type-Options: nosniff\n", body}
	}
	want400 := golden(400, `{"type":"about:blank","title":"Bad Request","status":400,"detail":"malformed id"}`)
	want404 := golden(404, `{"type":"about:blank","title":"Not Found","status":404}`)
	want503 := golden(503, `{"type":"about:blank","title":"Service Unavailable","status":503}`)
	srv, rdb := redistest.Private(t)
	opts := defaults("golden")
	opts.Outage = &guard.OutageOptions{FailFast: true} // the handler's Get reports the outage: its 503
	a := newApp(t, f, rdb, opts, Config{RetryAfter: 2 * time.Second})
	check := func(what, path string, want answer) {
		t.Helper()
		res := get(a, path).Result()
		var h strings.Builder
		for _, k := range slices.Sorted(maps.Keys(res.Header)) {
			for _, v := range res.Header[k] {
				fmt.Fprintf(&h, "%s: %s\n", k, v)
			}
		}
		body, _ := io.ReadAll(res.Body)
		if got := (answer{res.StatusCode, h.String(), string(body)}); got != want {
			t.Errorf("%s (%s):\n%d\n%s%s\nwant\n%d\n%s%s", what, path, got.status, got.headers, got.body, want.status, want.headers, want.body)
		}
	}
	check("the middleware's 400", "/products/%7Bx%7D", want400)
	check("the middleware's 404", "/products/999", want404)
	check("the handler's 404", "/products/3", want404)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	check("the middleware's 503 (unconfirmed)", "/products/998", want503)
	check("the handler's 503 (Redis down)", "/products/1", want503)
}

func newApp(t *testing.T, f Framework, rdb redis.UniversalClient, opts *guard.Options, cfg Config) *app {
	t.Helper()
	ctx := context.Background()
	if cfg.Logger != nil {
		opts.Logger = cfg.Logger
	}
	g, err := guard.New(ctx, rdb, "product", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		_ = yield("1", nil) && yield("3", nil)
	}, nil); err != nil {
		t.Fatal(err)
	}
	// Rebuild refreshed the filter's copy before it returned: its commands
	// are over before a test counts its own, and it answers in an outage.
	if !opts.Filter.NoLocalCopy && g.Stats().FilterCopy == 0 {
		t.Fatal("no copy of the filter after its rebuild")
	}
	a := &app{g: g}
	a.Router = f.New(g, cfg, func(r *http.Request, id string) (string, error) {
		a.ran.Add(1)
		ctx := r.Context()
		if a.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, a.deadline)
			defer cancel()
		}
		p, err := guard.Get(ctx, g, id, func(ctx context.Context, id string) (product, error) {
			a.loads.Add(1)
			if a.slow != nil {
				<-a.slow
			}
			if id == "1" {
				return product{"1", "lamp"}, nil
			}
			return product{}, guard.ErrNotFound
		})
		return p.Name, err
	})
	return a
}

// Guard returns a Guard on a connection of the test's own, closed with the
// test, whose filter holds id: for an adapter's tests outside the suite.
func Guard(t *testing.T, id string) *guard.Guard {
	t.Helper()
	c := redistest.Connect(t)
	ctx := context.Background()
	g, err := guard.New(ctx, c, "product", defaults(c.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) { yield(id, nil) }, nil); err != nil {
		t.Fatal(err)
	}
	return g
}

func defaults(prefix string) *guard.Options {
	return &guard.Options{KeyPrefix: prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}}
}

func get(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec
}

func unknownKnownMalformed(t *testing.T, f Framework) {
	c := redistest.Connect(t)
	a := newApp(t, f, c, defaults(c.Prefix), Config{})
	if rec := get(a, "/products/1"); rec.Code != 200 || rec.Body.String() != "lamp" {
		t.Fatalf("known: %d %q", rec.Code, rec.Body)
	}
	c.Counter.Reset()
	if rec := get(a, "/products/1"); rec.Code != 200 || c.Counter.RoundTrips() != 1 {
		t.Fatalf("hit through the middleware: %d, %d round trips", rec.Code, c.Counter.RoundTrips())
	}
	real := get(a, "/products/3")
	loads := a.loads.Load()
	rejected := get(a, "/products/999")
	if a.loads.Load() != loads {
		t.Fatal("the loader ran for an ID the filter rejects")
	}
	if real.Code != 404 || rejected.Code != 404 || !bytes.Equal(real.Body.Bytes(), rejected.Body.Bytes()) ||
		fmt.Sprint(real.Header()) != fmt.Sprint(rejected.Header()) {
		t.Fatalf("not identical:\n%d %s %v\n%d %s %v", real.Code, real.Body, real.Header(), rejected.Code, rejected.Body, rejected.Header())
	}
	if ct := rejected.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q", ct)
	}
	for _, bad := range []string{"..%2Fx", strings.Repeat("a", 4097), "%00", "%7Bx%7D", "42:lock"} {
		c.Counter.Reset()
		rec := get(a, "/products/"+bad)
		if rec.Code != 400 || c.Counter.Commands() != 0 {
			t.Fatalf("%q: %d, %d Redis commands", bad, rec.Code, c.Counter.Commands())
		}
	}
}

func skipperAndRedisDown(t *testing.T, f Framework) {
	srv, rdb := redistest.Private(t)
	open := newApp(t, f, rdb, defaults("open"), Config{})
	closed := newApp(t, f, rdb, defaults("closed"), Config{FailClosed: true})
	skip := newApp(t, f, rdb, defaults("skip"), Config{SkipHeader: "X-Internal"})

	req := httptest.NewRequest("GET", "/products/999", nil)
	req.Header.Set("X-Internal", "1")
	rec := httptest.NewRecorder()
	skip.ServeHTTP(rec, req)
	if rec.Code != 404 || skip.ran.Load() != 1 {
		t.Fatalf("skipped middleware: the handler must decide: %d, handler ran %d", rec.Code, skip.ran.Load())
	}

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	// Fail open: the middleware lets the request through, and the
	// handler's guard.Get loads through (the outage policy): served from
	// the source of truth.
	loads := open.loads.Load()
	rec = get(open, "/products/1")
	if rec.Code != 200 || rec.Body.String() != "lamp" || open.loads.Load() != loads+1 {
		t.Fatalf("fail open: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	loads = closed.loads.Load()
	rec = get(closed, "/products/1")
	if rec.Code != 503 || closed.loads.Load() != loads {
		t.Fatalf("fail closed: %d, loads %d", rec.Code, closed.loads.Load()-loads)
	}
}

// retryAfterIsTheConfiguredValue: the error handler sends the middleware's
// RetryAfter with every 503, the middleware's own (fail closed) and the
// handler's HTTPError(err) (fail open), and logs the error behind it.
func retryAfterIsTheConfiguredValue(t *testing.T, f Framework) {
	srv, rdb := redistest.Private(t)
	var logs bytes.Buffer
	cfg := Config{RetryAfter: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	// The Guards fail fast, so that the handler's guard.Get reports the
	// outage (by default it would load through and answer 200).
	failFast := func(prefix string) *guard.Options {
		o := defaults(prefix)
		o.Outage = &guard.OutageOptions{FailFast: true}
		return o
	}
	open := newApp(t, f, rdb, failFast("open"), cfg)
	cfg.FailClosed = true
	closed := newApp(t, f, rdb, failFast("closed"), cfg)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]*app{"fail open": open, "fail closed": closed} {
		rec := get(a, "/products/1")
		if rec.Code != 503 || rec.Header().Get("Retry-After") != "5" {
			t.Errorf("%s: %d, Retry-After %q, want 503 and 5", name, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
	if !strings.Contains(logs.String(), "redis unavailable") {
		t.Fatalf("the error behind the 503 was not logged:\n%s", logs.String())
	}
}

// clientThatLeftIsNotAnOutage: a request whose context is already
// cancelled (its client disconnected) is not logged as the filter being
// unavailable, nor counted as a Redis failure.
func clientThatLeftIsNotAnOutage(t *testing.T, f Framework) {
	c := redistest.Connect(t)
	var logs bytes.Buffer
	a := newApp(t, f, c, defaults(c.Prefix), Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 {
		a.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/products/1", nil).WithContext(ctx))
	}
	if strings.Contains(logs.String(), "filter unavailable") {
		t.Fatalf("a cancelled request was logged as an outage:\n%s", logs.String())
	}
	if st := a.g.Stats(); st.RedisErrors != 0 || st.BreakerOpens != 0 {
		t.Fatalf("cancelled requests counted as Redis failures: %+v", st)
	}
}

// unfilteredRouteIsReported: a route whose parameter is not the
// middleware's Param (/things/:sku, default Param "id") passes unfiltered;
// logged once per route, counted per request; a route without parameters
// is quiet. A second such route on the same Guard is reported too: the
// Guard's log limits each route apart.
func unfilteredRouteIsReported(t *testing.T, f Framework) {
	c := redistest.Connect(t)
	var logs bytes.Buffer
	a := newApp(t, f, c, defaults(c.Prefix), Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var unfiltered atomic.Int32
	cfg := Config{OnUnfiltered: func(string) { unfiltered.Add(1) }}
	a.OK("/things/:sku", a.g, cfg)
	a.OK("/gadgets/:code", a.g, cfg)
	a.OK("/things", a.g, cfg)
	for range 3 {
		if rec := get(a, "/things/999"); rec.Code != 200 {
			t.Fatalf("unfiltered route: %d", rec.Code)
		}
		get(a, "/things")
	}
	get(a, "/gadgets/7")
	if n := unfiltered.Load(); n != 4 {
		t.Fatalf("OnUnfiltered called %d times, want 4", n)
	}
	out := logs.String()
	if n := strings.Count(out, "unfiltered"); n != 2 || !strings.Contains(out, "sku") || !strings.Contains(out, "code") {
		t.Fatalf("want one warning naming each of the two routes, got %d:\n%s", n, out)
	}
}

// outageLogsAFewLines: with Redis down, thousands of requests through the
// middleware (passing through, then the handler's Get loading through)
// write a few lines, not one per request: the adapter logs through the
// Guard's rate-limited logger.
func outageLogsAFewLines(t *testing.T, f Framework) {
	if testing.Short() {
		t.Skip("10 s of an outage: make test")
	}
	srv, rdb := redistest.Private(t)
	var logs redistest.Logs
	a := newApp(t, f, rdb, defaults("down"), Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	b := newApp(t, f, rdb, defaults("closed"), Config{FailClosed: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		get(a, "/products/1")
		get(b, fmt.Sprintf("/products/%d", i))
	}
	lines := strings.Count(logs.String(), "\n")
	if lines > 20 || !strings.Contains(logs.String(), "filter unavailable") || !strings.Contains(logs.String(), "/products/") {
		t.Fatalf("4,000 requests in an outage wrote %d log lines (want a few, naming the route):\n%s", lines, logs.String())
	}
}

// deadlineIs503: a load slower than LoadTimeout, or than the request's own
// deadline, is a 503 with Retry-After, never a 500, and its log line names
// the route and the ID.
func deadlineIs503(t *testing.T, f Framework) {
	c := redistest.Connect(t)
	var logs redistest.Logs
	opts := defaults(c.Prefix)
	opts.LoadTimeout = 20 * time.Millisecond
	a := newApp(t, f, c, opts, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	block := make(chan struct{})
	defer close(block)
	a.slow = block
	rec := get(a, "/products/1")
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a load past LoadTimeout: %d, Retry-After %q; want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	rec = httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest("GET", "/products/1", nil).WithContext(ctx))
	if rec.Code != 503 {
		t.Fatalf("a request past its own deadline: %d; want 503", rec.Code)
	}
	if !regexp.MustCompile(`route="?[^=]*/products/\S* id=1 status=503`).MatchString(logs.String()) {
		t.Fatalf("the 503's log line lacks the route and the ID:\n%s", logs.String())
	}
}
