// Package echov5 puts cacheguard's bloom filter in front of Echo v5 handlers:
// unknown IDs get 404 and malformed ones 400 before the handler runs, and a
// hit through the middleware stays one Redis round trip (the handler's Get
// reuses the middleware's read).
//
//	e.HTTPErrorHandler = cgecho.ErrorHandler(echo.DefaultHTTPErrorHandler(false))
//	e.GET("/products/:id", getProduct, cgecho.Middleware(g))
//	// in the handler: if err != nil { return cgecho.HTTPError(err) }
//
// Import it under another name than Echo's own package (cgecho). It shares
// its decisions with the net/http and Echo v4 adapters
// (adapters/internal/core); docs/usage.md has the details.
package echov5

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	labecho "github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

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
	ID func(c *labecho.Context) string
	// Rules: which IDs pass, and what a 503 says (see adapters.Rules).
	adapters.Rules
}

// DefaultConfig is the configuration Middleware uses.
var DefaultConfig = Config{
	Skipper: middleware.DefaultSkipper,
	Param:   "id",
	Rules:   adapters.Rules{RetryAfter: time.Second},
}

// Problem is an RFC 9457 problem details object.
type Problem = core.Problem

// Error is the error this package's middleware and HTTPError return: the
// problem to answer with and, for a 5xx, the error behind it (Unwrap), which
// is logged and never sent.
type Error struct {
	Problem Problem
	Err     error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("cacheguard: %d %s", e.Problem.Status, e.Problem.Title)
	}
	return fmt.Sprintf("cacheguard: %d %s: %v", e.Problem.Status, e.Problem.Title, e.Err)
}

// StatusCode makes Error an echo.HTTPStatusCoder.
func (e *Error) StatusCode() int { return e.Problem.Status }

// Unwrap returns the error behind a 5xx (nil otherwise).
func (e *Error) Unwrap() error { return e.Err }

// ProblemError makes Error an echo.ProblemErrorer, for applications that
// use echo.ProblemDetailsHTTPErrorHandler instead of ErrorHandler.
func (e *Error) ProblemError() *labecho.ProblemError {
	p := e.Problem
	return &labecho.ProblemError{Type: p.Type, Title: p.Title, Status: p.Status, Detail: p.Detail}
}

func problem(status int) *Error { return &Error{Problem: core.ProblemFor(status)} }

// NotFound is the error for an ID that does not exist: the middleware
// returns it for IDs the filter rejects, handlers return it (or HTTPError)
// for their own "not found".
func NotFound() *Error { return problem(http.StatusNotFound) }

// HTTPError maps an error from guard.Get to an *Error without the error's
// text: 404 for ErrNotFound, 400 for ErrInvalidKey, 503 for ErrBusy,
// ErrUnavailable and a deadline (ErrorHandler adds Retry-After), and 500
// otherwise. The
// error of a 5xx is kept (Unwrap) for logging.
func HTTPError(err error) *Error {
	status := core.Status(err)
	e := problem(status)
	if status >= 500 {
		e.Err = err
	}
	return e
}

// ErrorHandler renders the errors of this package as
// application/problem+json (with Retry-After on 503: the RetryAfter of the
// middleware the request went through, else 1 second) and hands every other
// error to next (e.g. echo.DefaultHTTPErrorHandler(false)). The error behind
// a 5xx is logged, with the route and the ID, through the Guard's logger
// (rate-limited with its own lines); without the middleware, to Echo's.
func ErrorHandler(next labecho.HTTPErrorHandler) labecho.HTTPErrorHandler {
	return func(c *labecho.Context, err error) {
		var e *Error
		if !errors.As(err, &e) {
			next(c, err)
			return
		}
		if r, _ := labecho.UnwrapResponse(c.Response()); r != nil && r.Committed {
			next(c, err)
			return
		}
		p := e.Problem
		cc := core.FromContext(c.Request().Context())
		if !cc.Failed(c.Request().Context(), p.Status, e.Err) && p.Status >= 500 && core.Loggable(e.Err) {
			c.Logger().ErrorContext(c.Request().Context(), "cacheguard: request failed", "status", p.Status, "err", e.Err) // no middleware
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
		cfg.ID = func(c *labecho.Context) string { return c.Param(param) }
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultConfig.RetryAfter
	}
	cr := core.New(g, cfg.Rules)
	return func(next labecho.HandlerFunc) labecho.HandlerFunc {
		return func(c *labecho.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			r := c.Request()
			v := cr.Decide(r.Context(), cfg.ID(c), c.Path(), core.RouteHasWildcards(c.Path()) || len(c.PathValues()) > 0)
			// The handler's Get reuses Peek's read, and ErrorHandler finds
			// this middleware's Retry-After, through the request's context.
			c.SetRequest(r.WithContext(v.Ctx))
			if v.Decision == core.Pass {
				return next(c)
			}
			e := problem(core.StatusOf(v.Decision))
			e.Err = v.Err
			return e
		}
	}
}
