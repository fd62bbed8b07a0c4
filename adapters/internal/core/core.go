// Package core is what the HTTP adapters share, so that they cannot drift:
// the ID rule, the decision for a request (pass, 400, 404, 503), the mapping
// of guard errors to statuses, the Retry-After value and the RFC 9457 problem
// bodies. adapters/nethttp, adapters/echo, adapters/echov5 and adapters/gin
// are thin skins that read the ID and the route from their framework, call
// Decide, and write or return what it decided.
package core

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/guard"
)

// Decision is what to do with a request.
type Decision uint8

const (
	Pass        Decision = iota // hand it to the handler
	BadRequest                  // 400: malformed ID
	NotFound                    // 404: the ID does not exist
	Unavailable                 // 503: Redis cannot answer and FailClosed is set, or the ID is unconfirmed (guard.ErrUnconfirmed)
)

// Verdict is Decide's answer.
type Verdict struct {
	Decision Decision
	// Ctx is the request's context for the handler: it carries Peek's read
	// (so the handler's guard.Get costs no round trip) and the Request (so
	// the adapters' error helpers use its Retry-After and log its route and
	// ID).
	Ctx context.Context
	// Err is the Redis failure behind a pass-through or a 503, if any.
	Err error
}

// Core holds one middleware's settings. It is safe for concurrent use.
type Core struct {
	g            *guard.Guard
	valid        func(string) bool
	failClosed   bool
	retryAfter   string // whole seconds, as sent
	onUnfiltered func(string)
	log          *slog.Logger // the Guard's: rate-limited with its own lines

	unfiltered     atomic.Uint64
	warnedUnfilter sync.Map // route → struct{}: routes already warned about
}

// New returns the Core of a middleware on g.
func New(g *guard.Guard, o adapters.Rules) *Core {
	if o.Valid == nil {
		o.Valid = ValidChars(o.ExtraIDChars)
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	return &Core{
		g:            g,
		valid:        o.Valid,
		failClosed:   o.FailClosed,
		retryAfter:   strconv.Itoa(max(1, int(o.RetryAfter.Round(time.Second)/time.Second))),
		onUnfiltered: o.OnUnfiltered,
		log:          g.Logger(),
	}
}

// Request is what Decide leaves in a request's context for the error
// helpers behind the middleware. A nil *Request (no middleware) answers
// with the defaults and logs nothing.
type Request struct {
	c         *Core
	route, id string
}

type requestKey struct{}

// FromContext returns the Request that Decide left in ctx, or nil.
func FromContext(ctx context.Context) *Request {
	r, _ := ctx.Value(requestKey{}).(*Request)
	return r
}

// RetryAfter is the Retry-After header value of the middleware, or "1".
func (r *Request) RetryAfter() string {
	if r == nil {
		return "1"
	}
	return r.c.retryAfter
}

// Failed logs the error behind a 5xx answer through the Guard's logger,
// with the route and the ID; it reports whether it did (not for a client
// that left, nor without a middleware).
func (r *Request) Failed(ctx context.Context, status int, err error) bool {
	if r == nil || status < 500 || !Loggable(err) {
		return false
	}
	r.c.log.ErrorContext(ctx, "cacheguard: request failed", "route", r.route, "id", r.id, "status", status, "err", err)
	return true
}

// Decide decides a request for id on route (the route pattern, for
// warnings); hasWildcards says whether the route has path wildcards. Its
// warnings go to the Guard's logger, rate-limited with the Guard's own
// lines, so an outage writes a few lines a minute whatever the traffic.
func (c *Core) Decide(ctx context.Context, id, route string, hasWildcards bool) Verdict {
	ctx = context.WithValue(ctx, requestKey{}, &Request{c: c, route: route, id: id})
	if id == "" {
		if !hasWildcards {
			return Verdict{Decision: Pass, Ctx: ctx} // a route without an ID: nothing to check
		}
		c.unfiltered.Add(1)
		if c.onUnfiltered != nil {
			c.onUnfiltered(route)
		}
		if _, seen := c.warnedUnfilter.LoadOrStore(route, struct{}{}); !seen {
			c.log.WarnContext(ctx, "cacheguard: route has path wildcards but the middleware found no ID in it; its requests "+
				"pass unfiltered (name the wildcard as the middleware's Param, or set its ID extractor)", "route", route)
		}
		return Verdict{Decision: Pass, Ctx: ctx}
	}
	if !c.valid(id) {
		return Verdict{Decision: BadRequest, Ctx: ctx}
	}
	pctx, maybe, err := c.g.Peek(ctx, id)
	switch {
	case err == nil && maybe:
		return Verdict{Decision: Pass, Ctx: pctx}
	case err == nil:
		return Verdict{Decision: NotFound, Ctx: ctx}
	case errors.Is(err, guard.ErrInvalidKey):
		return Verdict{Decision: BadRequest, Ctx: ctx}
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		// The client left: not an outage, nothing to warn of. The handler
		// sees the same ctx.
		return Verdict{Decision: Pass, Ctx: ctx}
	case errors.Is(err, guard.ErrUnconfirmed):
		// The filter's copy has never seen the ID: its Get would not load
		// it either (the Guard logs these).
		return Verdict{Decision: Unavailable, Ctx: ctx, Err: err}
	case c.failClosed:
		c.log.WarnContext(ctx, "cacheguard: filter unavailable, failing closed", "route", route, "id", id, "err", err)
		return Verdict{Decision: Unavailable, Ctx: ctx, Err: err}
	default:
		// pctx tells the handler's Get that Redis did not answer within
		// Peek's 100 ms, so it loads through without waiting again.
		c.log.WarnContext(ctx, "cacheguard: filter unavailable, passing through", "route", route, "id", id, "err", err)
		return Verdict{Decision: Pass, Ctx: pctx, Err: err}
	}
}

// RouteHasWildcards reports whether a route path in Echo's or Gin's syntax
// ("/things/:sku", "/files/*") has path wildcards: judged by the route, as
// net/http's pattern is, so a misnamed one is reported even when the
// framework has not filled in the values.
func RouteHasWildcards(path string) bool { return strings.ContainsAny(path, ":*") }

// Unfiltered counts the requests that passed unfiltered because their route
// had wildcards but no ID was found.
func (c *Core) Unfiltered() uint64 { return c.unfiltered.Load() }

// Status maps an error from guard.Get to a status: 404 for ErrNotFound, 400
// for ErrInvalidKey, 503 for ErrBusy, ErrUnavailable and a deadline (the
// request's own, or LoadTimeout: a slow database is no server bug), 500
// otherwise.
func Status(err error) int {
	switch {
	case errors.Is(err, guard.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, guard.ErrInvalidKey):
		return http.StatusBadRequest
	case errors.Is(err, guard.ErrBusy), errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Loggable reports whether the error behind a 5xx answer is worth a log
// line: not when the client went away (context.Canceled).
func Loggable(err error) bool { return err != nil && !errors.Is(err, context.Canceled) }

// StatusOf is the status of a Decision (0 for Pass).
func StatusOf(d Decision) int {
	switch d {
	case BadRequest:
		return http.StatusBadRequest
	case NotFound:
		return http.StatusNotFound
	case Unavailable:
		return http.StatusServiceUnavailable
	}
	return 0
}

// Write writes the problem answer of status to w, as every adapter
// answers: req (nil: defaults) gives the Retry-After of a 503.
func Write(w http.ResponseWriter, req *Request, status int) {
	WriteBody(w, req, status, BodyFor(status))
}

// WriteBody is Write with the body given: the Echo adapters' errors carry
// their Problem. A HEAD answer is written whole too (net/http drops its
// body), so its headers are the GET's.
func WriteBody(w http.ResponseWriter, req *Request, status int, body []byte) {
	h := w.Header()
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", req.RetryAfter())
	}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// ProblemFor is the problem the adapters answer with status: no internal
// error text, ever.
func ProblemFor(status int) Problem {
	p := Problem{Type: "about:blank", Title: http.StatusText(status), Status: status}
	if status == http.StatusBadRequest {
		p.Detail = "malformed id"
	}
	return p
}

// bodies are the JSON of the adapters' own problems, made once.
var bodies = map[int][]byte{}

func init() {
	for _, status := range []int{http.StatusBadRequest, http.StatusNotFound, http.StatusInternalServerError, http.StatusServiceUnavailable} {
		bodies[status] = Body(ProblemFor(status))
	}
}

// BodyFor is Body(ProblemFor(status)), made once for the statuses the
// adapters answer with.
func BodyFor(status int) []byte {
	if b, ok := bodies[status]; ok {
		return b
	}
	return Body(ProblemFor(status))
}

// Body is the JSON of p; for the adapters' own problems it is the same bytes
// whoever writes them, so a filter rejection is byte for byte the handler's
// own "not found" (the filter is no oracle of which IDs exist).
func Body(p Problem) []byte {
	b, _ := json.Marshal(p) // a Problem always marshals
	return b
}

// ValidChars returns the default ID rule: URL-unreserved characters
// (letters, digits, '-', '.', '_', '~') and the extra ones, not "." or "..".
// Path separators, braces, spaces and control bytes are refused unless extra
// names them (it may not name control bytes).
func ValidChars(extra string) func(id string) bool {
	var ok [256]bool
	for c := 'a'; c <= 'z'; c++ {
		ok[c], ok[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		ok[c] = true
	}
	for _, c := range "-._~" + extra {
		if c > ' ' && c < 0x7f {
			ok[c] = true
		}
	}
	return func(id string) bool {
		if id == "" || id == "." || id == ".." {
			return false
		}
		for i := 0; i < len(id); i++ {
			if !ok[id[i]] {
				return false
			}
		}
		return true
	}
}
