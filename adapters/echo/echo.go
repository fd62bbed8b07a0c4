// Package echo puts cacheguard's bloom filter in front of Echo v4 handlers:
// unknown IDs get 404 and malformed ones 400 before the handler runs, and a
// hit through the middleware stays one Redis round trip (the handler's Get
// reuses the middleware's read).
//
//	e.HTTPErrorHandler = cgecho.ErrorHandler(e.DefaultHTTPErrorHandler)
//	e.GET("/products/:id", getProduct, cgecho.Middleware(g))
//	// in the handler: if err != nil { return cgecho.HTTPError(err) }
//
// Import it under another name than Echo's own package (cgecho). It shares
// its decisions with the net/http and Echo v5 adapters
// (adapters/internal/core); docs/usage.md has the details.
package echo

import (
	"errors"
	"net/http"
	"time"

	labecho "github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/internal/core"
	"github.com/cacheguard/cacheguard/guard"
)

// Config configures the middleware.
type Config struct {
	// Skipper skips the middleware for some requests.
	Skipper middleware.Skipper
	// Param is the path parameter holding the ID. Default "id".
	Param string
	// ID reads the ID; default c.Param(Param). An empty ID passes;
	// on a route with path parameters that is logged (once per route) and
	// counted (OnUnfiltered), since the filter is then not filtering it.
	ID func(c labecho.Context) string
	// Rules: which IDs pass, and what a 503 says (see adapters.Rules).
	adapters.Rules
}

// DefaultConfig is the configuration Middleware uses.
var DefaultConfig = Config{
	Skipper: middleware.DefaultSkipper,
	Param:   "id",
	Rules:   adapters.Rules{RetryAfter: time.Second},
}

// Problem is an RFC 9457 problem details object, the Message of the
// *echo.HTTPError values this package returns.
type Problem = core.Problem

func problem(status int) *labecho.HTTPError {
	return labecho.NewHTTPError(status, core.ProblemFor(status))
}

// NotFound is the error for an ID that does not exist: the middleware
// returns it for IDs the filter rejects, handlers return it (or HTTPError)
// for their own "not found".
func NotFound() *labecho.HTTPError { return problem(http.StatusNotFound) }

// HTTPError maps an error from guard.Get to an *echo.HTTPError without the
// error's text: 404 for ErrNotFound, 400 for ErrInvalidKey, 503 for ErrBusy,
// ErrUnavailable and a deadline (ErrorHandler adds Retry-After), and 500
// otherwise.
// Internal keeps the error of a 5xx for logging.
func HTTPError(err error) *labecho.HTTPError {
	status := core.Status(err)
	he := problem(status)
	if status >= 500 {
		he = he.SetInternal(err)
	}
	return he
}

// ErrorHandler renders the Problem errors of this package as
// application/problem+json (with Retry-After on 503: the RetryAfter of the
// middleware the request went through, else 1 second) and hands every other
// error to next (e.g. e.DefaultHTTPErrorHandler). The error behind a 5xx is
// logged, with the route and the ID, through the Guard's logger
// (rate-limited with its own lines); without the middleware, to Echo's.
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
		cc := core.FromContext(c.Request().Context())
		if !cc.Failed(c.Request().Context(), p.Status, he.Internal) && p.Status >= 500 && core.Loggable(he.Internal) {
			c.Logger().Errorf("cacheguard: request failed (%d): %v", p.Status, he.Internal) // no middleware: Echo's logger
		}
		core.WriteBody(c.Response(), cc, p.Status, core.Body(p)) // net/http's and Gin's answer, byte for byte
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
	if cfg.ID == nil {
		param := cfg.Param
		cfg.ID = func(c labecho.Context) string { return c.Param(param) }
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultConfig.RetryAfter
	}
	cr := core.New(g, cfg.Rules)
	return func(next labecho.HandlerFunc) labecho.HandlerFunc {
		return func(c labecho.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			r := c.Request()
			v := cr.Decide(r.Context(), cfg.ID(c), c.Path(), core.RouteHasWildcards(c.Path()) || len(c.ParamNames()) > 0)
			// The handler's Get reuses Peek's read, and ErrorHandler finds
			// this middleware's Retry-After, through the request's context.
			c.SetRequest(r.WithContext(v.Ctx))
			if v.Decision == core.Pass {
				return next(c)
			}
			he := problem(core.StatusOf(v.Decision))
			if v.Err != nil {
				he = he.SetInternal(v.Err)
			}
			return he
		}
	}
}
