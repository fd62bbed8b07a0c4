// Package nethttp puts a Guard's bloom filter in front of net/http handlers:
// an ID the filter has never seen, or whose "not found" marker is cached,
// gets 404, a malformed one 400 (no Redis command), and anything else goes
// on to the handler, whose guard.Get reuses the middleware's read (a hit
// stays one round trip).
//
//	mux.Handle("GET /users/{id}", nethttp.Middleware(g, nil)(getUser))
//	// in the handler: if err != nil { nethttp.Error(w, r, err) }
//
// Answers are RFC 9457 problem details; the filter's 404 is the handler's
// own, byte for byte, so it is no oracle of which IDs exist. When Redis
// cannot answer within 100 ms (guard.Guard.Peek), whatever the request's
// context (deadlines belong in the handler), requests pass through unless
// Options.FailClosed is set. It logs through the Guard's rate-limited logger.
package nethttp

import (
	"net/http"
	"strings"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/internal/core"
	"github.com/cacheguard/cacheguard/guard"
)

// Options configures Middleware. A nil *Options means defaults.
type Options struct {
	// Param is the path wildcard holding the ID ("/users/{id}"). Default "id".
	Param string
	// ID extracts the ID from a request. Default r.PathValue(Param). An empty
	// ID passes through; on a route with path wildcards that is logged (once
	// per route) and counted (OnUnfiltered), since it means the filter is
	// not filtering that route.
	ID func(r *http.Request) string
	// Rules: which IDs pass, and what a 503 says (see adapters.Rules).
	adapters.Rules
}

// Middleware returns net/http middleware that rejects unknown and malformed
// IDs before next runs.
func Middleware(g *guard.Guard, opts *Options) func(http.Handler) http.Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Param == "" {
		o.Param = "id"
	}
	if o.ID == nil {
		param := o.Param
		o.ID = func(r *http.Request) string { return r.PathValue(param) }
	}
	c := core.New(g, o.Rules)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			v := c.Decide(r.Context(), o.ID(r), r.Pattern, strings.Contains(r.Pattern, "{"))
			if v.Decision == core.Pass {
				next.ServeHTTP(w, r.WithContext(v.Ctx))
				return
			}
			core.Write(w, core.FromContext(v.Ctx), core.StatusOf(v.Decision))
		})
	}
}

// NotFound writes the 404 problem answer that Middleware writes for unknown
// IDs. Handlers use it for their own "not found" (or use Error).
func NotFound(w http.ResponseWriter, r *http.Request) {
	core.Write(w, nil, http.StatusNotFound)
}

// Error writes the problem answer for an error from guard.Get: 404 for
// ErrNotFound, 400 for ErrInvalidKey, 503 with Retry-After for ErrBusy,
// ErrUnavailable and a deadline (the request's, or LoadTimeout), and 500
// otherwise, never with the error's text. Behind Middleware it uses the
// middleware's RetryAfter and logs the error of a 5xx answer, with the
// route and the ID, through the Guard's logger; elsewhere it sends
// Retry-After 1 and logs nothing.
func Error(w http.ResponseWriter, r *http.Request, err error) {
	req := core.FromContext(r.Context())
	status := core.Status(err)
	req.Failed(r.Context(), status, err)
	core.Write(w, req, status)
}
