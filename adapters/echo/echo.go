// Package echo puts a Guard's bloom filter in front of Echo (v4) handlers,
// so requests for IDs that cannot exist are answered before a handler (and
// its database) sees them.
//
// The middleware reads the ID from a path parameter (":id" by default) and
// does the read round trip of guard.Get (Guard.Peek: bloom probe and cache
// GET): an ID the filter has never seen (or whose empty marker is cached)
// ends in NotFound(), a malformed one in a 400 (no Redis command), and
// anything else goes on to the handler, whose guard.Get reuses what the
// middleware read (a hit is still one round trip) and returns HTTPError(err)
// on failure. Rejections are *echo.HTTPError
// values whose Message is an RFC 9457 Problem, so the application's own error
// handler renders them (ErrorHandler renders them as application/problem+json),
// and a filter rejection is byte for byte the handler's own "not found": the
// filter is no oracle of which IDs exist. When Redis cannot answer, the
// request passes through (fail open) unless Config.FailClosed is set.
//
// It follows Echo's middleware conventions: Config with a Skipper,
// DefaultConfig, Middleware and MiddlewareWithConfig. Import it under another
// name than Echo's own package, e.g. cgecho.
package echo

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	labecho "github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/cacheguard/cacheguard/adapters/nethttp"
	"github.com/cacheguard/cacheguard/guard"
)

// Config configures the middleware.
type Config struct {
	// Skipper skips the middleware for some requests.
	Skipper middleware.Skipper
	// Param is the path parameter holding the ID. Default "id".
	Param string
	// IDExtractor reads the ID; default c.Param(Param). An empty ID passes.
	IDExtractor func(c labecho.Context) string
	// Valid says whether an ID is well-formed; others get 400 before any
	// Redis command. Default nethttp.ValidID.
	Valid func(id string) bool
	// FailClosed answers 503 when Redis is unavailable instead of passing
	// the request through.
	FailClosed bool
	// RetryAfter is sent with 503 answers. Default 1 second.
	RetryAfter time.Duration
}

// DefaultConfig is the configuration Middleware uses.
var DefaultConfig = Config{
	Skipper:    middleware.DefaultSkipper,
	Param:      "id",
	Valid:      nethttp.ValidID,
	RetryAfter: time.Second,
}

// Problem is an RFC 9457 problem details object, the Message of the
// *echo.HTTPError values this package returns.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func problem(status int, detail string) *labecho.HTTPError {
	return labecho.NewHTTPError(status, Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}

// NotFound is the error for an ID that does not exist: the middleware
// returns it for IDs the filter rejects, handlers return it (or HTTPError)
// for their own "not found".
func NotFound() *labecho.HTTPError { return problem(http.StatusNotFound, "") }

// HTTPError maps an error from guard.Get to an *echo.HTTPError without the
// error's text: 404 for ErrNotFound, 400 for ErrInvalidKey, 503 for ErrBusy
// and ErrUnavailable (the error handler should add Retry-After; ErrorHandler
// does), and 500 otherwise (Internal keeps the error for logging).
func HTTPError(err error) *labecho.HTTPError {
	switch {
	case errors.Is(err, guard.ErrNotFound):
		return NotFound()
	case errors.Is(err, guard.ErrInvalidKey):
		return problem(http.StatusBadRequest, "malformed id")
	case errors.Is(err, guard.ErrBusy), errors.Is(err, guard.ErrUnavailable):
		return problem(http.StatusServiceUnavailable, "").SetInternal(err)
	default:
		return problem(http.StatusInternalServerError, "").SetInternal(err)
	}
}

// ErrorHandler renders the Problem errors of this package as
// application/problem+json (with Retry-After on 503) and hands every other
// error to next (e.g. e.DefaultHTTPErrorHandler).
func ErrorHandler(next labecho.HTTPErrorHandler) labecho.HTTPErrorHandler {
	return func(err error, c labecho.Context) {
		var he *labecho.HTTPError
		p, ok := Problem{}, false
		if errors.As(err, &he) {
			p, ok = he.Message.(Problem)
		}
		if !ok || c.Response().Committed {
			next(err, c)
			return
		}
		if p.Status == http.StatusServiceUnavailable {
			c.Response().Header().Set("Retry-After", "1")
		}
		body, _ := json.Marshal(p)
		if c.Request().Method == http.MethodHead {
			_ = c.NoContent(p.Status)
			return
		}
		_ = c.Blob(p.Status, "application/problem+json", body)
	}
}

// Middleware returns the middleware with DefaultConfig.
func Middleware(g *guard.Guard) labecho.MiddlewareFunc {
	return MiddlewareWithConfig(g, DefaultConfig)
}

// MiddlewareWithConfig returns the middleware with cfg; zero fields take
// DefaultConfig's values.
func MiddlewareWithConfig(g *guard.Guard, cfg Config) labecho.MiddlewareFunc {
	if cfg.Skipper == nil {
		cfg.Skipper = DefaultConfig.Skipper
	}
	if cfg.Param == "" {
		cfg.Param = DefaultConfig.Param
	}
	if cfg.IDExtractor == nil {
		param := cfg.Param
		cfg.IDExtractor = func(c labecho.Context) string { return c.Param(param) }
	}
	if cfg.Valid == nil {
		cfg.Valid = DefaultConfig.Valid
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultConfig.RetryAfter
	}
	retryAfter := strconv.Itoa(max(1, int(cfg.RetryAfter.Round(time.Second)/time.Second)))
	return func(next labecho.HandlerFunc) labecho.HandlerFunc {
		return func(c labecho.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			id := cfg.IDExtractor(c)
			if id == "" {
				return next(c)
			}
			if !cfg.Valid(id) {
				return problem(http.StatusBadRequest, "malformed id")
			}
			// Peek is Get's own read; the handler's guard.Get reuses it,
			// so the check costs no extra round trip.
			ctx, maybe, err := g.Peek(c.Request().Context(), id)
			switch {
			case err == nil && maybe:
				c.SetRequest(c.Request().WithContext(ctx))
				return next(c)
			case err == nil:
				return NotFound()
			case errors.Is(err, guard.ErrInvalidKey):
				return problem(http.StatusBadRequest, "malformed id")
			case cfg.FailClosed:
				c.Response().Header().Set("Retry-After", retryAfter)
				return problem(http.StatusServiceUnavailable, "").SetInternal(err)
			default:
				c.Logger().Warnf("cacheguard: filter unavailable, passing through: %v", err)
				return next(c)
			}
		}
	}
}
