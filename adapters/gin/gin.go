// Package gin puts cacheguard's bloom filter in front of Gin handlers:
// unknown IDs get 404 and malformed ones 400 before the handler runs, and a
// hit through the middleware stays one Redis round trip (the handler's Get
// reuses the middleware's read). Set up as the package example's newEngine,
// Gin answers an encoded slash, a trailing slash, a HEAD and a POST as
// net/http's ServeMux does:
//
//	r.UseRawPath = true // "a%2Fb" reaches the middleware (400), not Gin's text 404
//	r.RedirectTrailingSlash, r.HandleMethodNotAllowed = false, true // 404 and 405, no 301
//	r.Match([]string{"GET", "HEAD"}, "/products/:id", cggin.Middleware(g), getProduct)
//	// in the handler: if err != nil { cggin.Error(c, err); return }
//
// Import it as cggin. It shares its decisions and its answers, byte for
// byte, with the net/http and Echo adapters (adapters/internal/core);
// docs/usage.md has the details.
package gin

import (
	"net/http"

	gingonic "github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/adapters"
	"github.com/cacheguard/cacheguard/adapters/internal/core"
	"github.com/cacheguard/cacheguard/guard"
)

// Config configures the middleware. The zero value is the default.
type Config struct {
	// Skipper, if set, skips the middleware for the requests it returns
	// true for.
	Skipper func(c *gingonic.Context) bool
	// Param is the path parameter holding the ID ("/products/:id").
	// Default "id".
	Param string
	// ID reads the ID; default c.Param(Param). An empty ID passes; on a
	// route with path parameters that is logged (once per route) and
	// counted (OnUnfiltered), since the filter is then not filtering it.
	ID func(c *gingonic.Context) string
	// Rules: which IDs pass, and what a 503 says (see adapters.Rules).
	adapters.Rules
}

// Middleware returns the middleware with the default Config.
func Middleware(g *guard.Guard) gingonic.HandlerFunc {
	return MiddlewareWithConfig(g, Config{})
}

// MiddlewareWithConfig returns the middleware with cfg. A request it
// rejects is answered and aborted (the handlers after it do not run).
func MiddlewareWithConfig(g *guard.Guard, cfg Config) gingonic.HandlerFunc {
	if cfg.Param == "" {
		cfg.Param = "id"
	}
	if cfg.ID == nil {
		param := cfg.Param
		cfg.ID = func(c *gingonic.Context) string { return c.Param(param) }
	}
	cr := core.New(g, cfg.Rules)
	return func(c *gingonic.Context) {
		if cfg.Skipper != nil && cfg.Skipper(c) {
			c.Next()
			return
		}
		route := c.FullPath()
		v := cr.Decide(c.Request.Context(), cfg.ID(c), route, core.RouteHasWildcards(route) || len(c.Params) > 0)
		// The handler's Get reuses Peek's read, and Error finds this
		// middleware's Retry-After, through the request's context.
		c.Request = c.Request.WithContext(v.Ctx)
		if v.Decision == core.Pass {
			c.Next()
			return
		}
		c.Abort()
		core.Write(c.Writer, core.FromContext(v.Ctx), core.StatusOf(v.Decision))
	}
}

// NotFound writes the 404 problem answer that the middleware writes for
// unknown IDs, and aborts. Handlers use it for their own "not found" (or
// use Error).
func NotFound(c *gingonic.Context) {
	c.Abort()
	core.Write(c.Writer, nil, http.StatusNotFound)
}

// Error writes the problem answer for an error from guard.Get, and aborts:
// 404 for ErrNotFound, 400 for ErrInvalidKey, 503 with Retry-After for
// ErrBusy, ErrUnavailable and a deadline, 500 otherwise, never with the
// error's text. Behind the middleware it uses its RetryAfter and logs the
// error of a 5xx, with the route and the ID, through the Guard's logger.
func Error(c *gingonic.Context, err error) {
	ctx := c.Request.Context()
	req := core.FromContext(ctx)
	status := core.Status(err)
	req.Failed(ctx, status, err)
	c.Abort()
	core.Write(c.Writer, req, status)
}
