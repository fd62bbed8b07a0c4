package echov5_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	labecho "github.com/labstack/echo/v5"

	"github.com/cacheguard/cacheguard/adapters"
	cgecho "github.com/cacheguard/cacheguard/adapters/echov5"
	"github.com/cacheguard/cacheguard/adapters/internal/adaptertest"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestEchoOwnProblemHandler: an application on Echo v5's own
// ProblemDetailsHTTPErrorHandler gets the same problem for a rejected ID as
// the adapter's ErrorHandler renders.
func TestEchoOwnProblemHandler(t *testing.T) {
	g := adaptertest.Guard(t, "1")
	serve := func(h labecho.HTTPErrorHandler) *httptest.ResponseRecorder {
		e := labecho.New()
		e.HTTPErrorHandler = h
		e.GET("/products/:id", func(c *labecho.Context) error { return c.String(http.StatusOK, "found") }, cgecho.Middleware(g))
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest("GET", "/products/999", nil))
		return rec
	}
	ours := serve(cgecho.ErrorHandler(labecho.DefaultHTTPErrorHandler(false))).Body.String()
	rec := serve(labecho.ProblemDetailsHTTPErrorHandler(false))
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Header().Get("Content-Type"), "application/problem+json") {
		t.Fatalf("echo's handler: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	for _, field := range []string{`"title":"Not Found"`, `"status":404`} {
		if !strings.Contains(rec.Body.String(), field) || !strings.Contains(ours, field) {
			t.Fatalf("want %s in both:\necho: %s\nours: %s", field, rec.Body, ours)
		}
	}
}

// TestHTTPErrorKeepsTheCauseOfA5xxOnly: the status comes through
// echo.StatusCode, the cause of a 5xx through errors.Is, and a 404 carries
// no cause.
func TestHTTPErrorKeepsTheCauseOfA5xxOnly(t *testing.T) {
	e := cgecho.HTTPError(guard.ErrUnavailable)
	if labecho.StatusCode(e) != http.StatusServiceUnavailable || !errors.Is(e, guard.ErrUnavailable) {
		t.Fatalf("503: status %d, cause kept %v", labecho.StatusCode(e), errors.Is(e, guard.ErrUnavailable))
	}
	nf := cgecho.HTTPError(guard.ErrNotFound)
	if labecho.StatusCode(nf) != http.StatusNotFound || nf.Unwrap() != nil {
		t.Fatalf("404: status %d, cause %v", labecho.StatusCode(nf), nf.Unwrap())
	}
	if labecho.StatusCode(cgecho.NotFound()) != http.StatusNotFound {
		t.Fatal("NotFound is not a 404")
	}
}

// TestMisnamedWildcardIsJudgedByTheRoute: a context whose route is
// "/things/:sku" but whose path values were never filled in (a context
// built by hand, a router that fills none) is reported as unfiltered,
// judged by the route as net/http judges its pattern, not passed silently.
func TestMisnamedWildcardIsJudgedByTheRoute(t *testing.T) {
	c := redistest.Connect(t)
	var logs bytes.Buffer
	g, err := guard.New(context.Background(), c, "product", &guard.Options{KeyPrefix: c.Prefix, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var unfiltered int
	mw := cgecho.MiddlewareWithConfig(g, cgecho.Config{Rules: adapters.Rules{OnUnfiltered: func(string) { unfiltered++ }}})
	ec := labecho.New().NewContext(httptest.NewRequest("GET", "/things/9", nil), httptest.NewRecorder())
	ec.SetPath("/things/:sku")
	if err := mw(func(c *labecho.Context) error { return c.NoContent(http.StatusOK) })(ec); err != nil {
		t.Fatal(err)
	}
	if unfiltered != 1 || !strings.Contains(logs.String(), "unfiltered") || !strings.Contains(logs.String(), "/things/:sku") {
		t.Fatalf("OnUnfiltered called %d times, logs:\n%s\nwant the route reported", unfiltered, logs.String())
	}
}
