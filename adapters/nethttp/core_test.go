package nethttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestRetryAfterIsTheConfiguredValue: the middleware's 503 and Error's 503
// behind it both send the configured Retry-After, and Error logs the error
// behind a 5xx, with the route and the ID, through the Guard's logger.
func TestRetryAfterIsTheConfiguredValue(t *testing.T) {
	srv, rdb := redistest.Private(t)
	var logs bytes.Buffer
	// The Guard fails fast, so that the handler's guard.Get reports the
	// outage (by default it would load through and answer 200).
	a := newAppWith(t, rdb, &guard.Options{KeyPrefix: "down", Outage: &guard.OutageOptions{FailFast: true},
		Filter: guard.FilterOptions{ExpectedItems: 1000}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	opts := &nethttp.Options{Rules: adapters.Rules{RetryAfter: 5 * time.Second}}
	mux := http.NewServeMux()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := guard.Get(r.Context(), a.g, r.PathValue("id"), func(context.Context, string) (user, error) { return user{}, nil })
		nethttp.Error(w, r, err)
	})
	mux.Handle("GET /open/{id}", nethttp.Middleware(a.g, opts)(handler))
	closed := *opts
	closed.FailClosed = true
	mux.Handle("GET /closed/{id}", nethttp.Middleware(a.g, &closed)(handler))
	mux.Handle("GET /boom/{id}", nethttp.Middleware(a.g, opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nethttp.Error(w, r, errors.New("db password wrong"))
	})))

	rec := get(t, mux, "/boom/1")
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "password") {
		t.Fatalf("500: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), `route="GET /boom/{id}" id=1 status=500 err="db password wrong"`) {
		t.Fatalf("the error behind the 500 was not logged (the first line of its cause is never held back):\n%s", logs.String())
	}
	for _, path := range []string{"/closed/1", "/open/1"} {
		rec := get(t, mux, path)
		if rec.Code != 503 || rec.Header().Get("Retry-After") != "5" {
			t.Errorf("%s with Redis down: %d, Retry-After %q, want 503 and 5", path, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
}

// TestIDRuleFollowsTheGuard: the length limit is the Guard's (4096 bytes),
// and ExtraIDChars admits emails and "user:1".
func TestIDRuleFollowsTheGuard(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	g, err := guard.New(
		ctx,
		c,
		"user",
		&guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	long := strings.Repeat("a", 4096)
	known := []string{"ada+news@example.com", "user:1", "0b9f3c1e-9d1a-4c2b-8f53-2f0c1a7d9e44", long}
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for _, id := range known {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(
		"GET /users/{id}",
		nethttp.Middleware(g, &nethttp.Options{Rules: adapters.Rules{ExtraIDChars: "@+:"}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})),
	)
	for _, id := range known {
		if rec := get(t, mux, "/users/"+id); rec.Code != 200 {
			t.Errorf("%q: %d, want 200", id, rec.Code)
		}
	}
	if rec := get(t, mux, "/users/"+strings.Repeat("b", 4096)); rec.Code != 404 {
		t.Errorf("unknown 4096-byte ID: %d, want 404", rec.Code)
	}
	c.Counter.Reset()
	for _, bad := range []string{strings.Repeat("a", 4097), "a%20b", "a{b}"} {
		if rec := get(t, mux, "/users/"+bad); rec.Code != 400 {
			t.Errorf("%q: %d, want 400", bad, rec.Code)
		}
	}
	if n := c.Counter.Commands(); n != 0 {
		t.Fatalf("malformed IDs sent %d Redis commands", n)
	}
}

// TestOutageLogsAFewLines: 10,000 requests through the middleware with
// Redis down write a few lines (the Guard's rate limit), not one per
// request; a deadline is a 503 with Retry-After whose line names the route
// and the ID.
func TestOutageLogsAFewLines(t *testing.T) {
	srv, rdb := redistest.Private(t)
	var logs bytes.Buffer
	a := newAppWith(t, rdb, &guard.Options{KeyPrefix: "down", Filter: guard.FilterOptions{ExpectedItems: 1000},
		LoadTimeout: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	block := make(chan struct{})
	defer close(block)
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", nethttp.Middleware(a.g, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := guard.Get(r.Context(), a.g, r.PathValue("id"), func(ctx context.Context, id string) (user, error) {
			if id == "2" {
				<-block
			}
			return user{ID: id}, nil
		})
		nethttp.Error(w, r, err)
	})))
	rec := get(t, mux, "/users/2")
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("a load past LoadTimeout: %d, Retry-After %q; want 503 and 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	if !strings.Contains(logs.String(), `route="GET /users/{id}" id=2 status=503`) {
		t.Fatalf("the 503's line lacks the route and the ID:\n%s", logs.String())
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	for i := range 10_000 {
		get(t, mux, fmt.Sprintf("/users/%d", i%100))
	}
	n := strings.Count(logs.String(), "\n")
	if n > 20 || !strings.Contains(logs.String(), "filter unavailable") {
		t.Fatalf("10,000 requests in an outage wrote %d lines (want a few):\n%s", n, logs.String())
	}
	t.Logf("10,000 requests in an outage: %d log lines", n)
}
