// Package nethttp puts a Guard's bloom filter in front of net/http handlers,
// so requests for IDs that cannot exist are answered before a handler (and
// its database) sees them.
//
// Middleware reads the ID from the request (by default r.PathValue("id")),
// and does the read round trip of guard.Get (Guard.Peek: bloom probe and
// cache GET): an ID the filter has never seen, or whose empty marker is
// cached, gets 404, a malformed one 400 (no Redis command at all), and
// anything else goes on to the handler, whose guard.Get reuses what the
// middleware read: a cache hit through the middleware is still one round
// trip. Answers are RFC 9457 problem details (application/problem+json)
// without internal error text. The 404 body is the one NotFound writes, byte
// for byte, so a client cannot tell a filter rejection from the handler's own
// "not found": the filter is no oracle of which IDs exist. When Redis cannot
// answer, the request passes through to the handler (fail open) unless
// Options.FailClosed is set.
package nethttp

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/cacheguard/cacheguard/guard"
)

// Options configures Middleware. A nil *Options means defaults.
type Options struct {
	// Param is the path wildcard holding the ID ("/users/{id}"). Default "id".
	Param string
	// ID extracts the ID from a request. Default r.PathValue(Param). An empty
	// ID passes through (the route does not carry one).
	ID func(r *http.Request) string
	// Valid says whether an ID is well-formed; others get 400 before any
	// Redis command. Default ValidID.
	Valid func(id string) bool
	// FailClosed answers 503 when Redis is unavailable, instead of passing
	// the request through to the handler.
	FailClosed bool
	// RetryAfter is sent with 503 answers. Default 1 second.
	RetryAfter time.Duration
	// Logger receives Redis failures. Default: no logging.
	Logger *slog.Logger
}

// Bodies of the problem answers. Fixed bytes: identical whoever writes them.
var (
	notFoundBody    = []byte(`{"type":"about:blank","title":"Not Found","status":404}`)
	badRequestBody  = []byte(`{"type":"about:blank","title":"Bad Request","status":400,"detail":"malformed id"}`)
	unavailableBody = []byte(`{"type":"about:blank","title":"Service Unavailable","status":503}`)
	internalBody    = []byte(`{"type":"about:blank","title":"Internal Server Error","status":500}`)
)

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
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	if o.Valid == nil {
		o.Valid = ValidID
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := o.ID(r)
			if id == "" {
				next.ServeHTTP(w, r)
				return
			}
			if !o.Valid(id) {
				write(w, http.StatusBadRequest, badRequestBody)
				return
			}
			// Peek is Get's own read; the handler's guard.Get reuses it,
			// so the check costs no extra round trip.
			ctx, maybe, err := g.Peek(r.Context(), id)
			switch {
			case err == nil && maybe:
				next.ServeHTTP(w, r.WithContext(ctx))
			case err == nil:
				NotFound(w, r)
			case errors.Is(err, guard.ErrInvalidKey):
				write(w, http.StatusBadRequest, badRequestBody)
			case o.FailClosed:
				o.Logger.WarnContext(r.Context(), "cacheguard: filter unavailable, failing closed", "err", err)
				unavailable(w, o.RetryAfter)
			default:
				o.Logger.WarnContext(r.Context(), "cacheguard: filter unavailable, passing through", "err", err)
				next.ServeHTTP(w, r)
			}
		})
	}
}

// ValidID accepts 1 to 128 bytes of URL-unreserved characters (letters,
// digits, '-', '.', '_', '~') that are not "." or "..": what numeric IDs,
// UUIDs, slugs and ULIDs are made of. Path separators, braces, colons,
// control bytes and overlong IDs are refused.
func ValidID(id string) bool {
	if id == "" || len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
			return false
		}
	}
	return true
}

// NotFound writes the 404 problem answer that Middleware writes for unknown
// IDs. Handlers use it for their own "not found" (or use Error).
func NotFound(w http.ResponseWriter, r *http.Request) {
	write(w, http.StatusNotFound, notFoundBody)
}

// Error writes the problem answer for an error from guard.Get: 404 for
// ErrNotFound, 400 for ErrInvalidKey, 503 with Retry-After for ErrBusy and
// ErrUnavailable, and 500 otherwise, never with the error's text.
func Error(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, guard.ErrNotFound):
		NotFound(w, r)
	case errors.Is(err, guard.ErrInvalidKey):
		write(w, http.StatusBadRequest, badRequestBody)
	case errors.Is(err, guard.ErrBusy), errors.Is(err, guard.ErrUnavailable):
		unavailable(w, time.Second)
	default:
		write(w, http.StatusInternalServerError, internalBody)
	}
}

func unavailable(w http.ResponseWriter, retryAfter time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(retryAfter.Round(time.Second)/time.Second))))
	write(w, http.StatusServiceUnavailable, unavailableBody)
}

func write(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
