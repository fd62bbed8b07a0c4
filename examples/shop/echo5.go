package main

import (
	"net/http"

	labecho "github.com/labstack/echo/v5"

	cgecho "github.com/cacheguard/cacheguard/adapters/echov5"
)

// routerV5 serves the routes on Echo v5 with the v5 adapter (the default).
func routerV5(routes []route) http.Handler {
	e := labecho.New()
	e.HTTPErrorHandler = cgecho.ErrorHandler(labecho.DefaultHTTPErrorHandler(false))
	m := errorMapping{
		request:  func(code int, msg string) error { return labecho.NewHTTPError(code, msg) },
		notFound: func() error { return cgecho.NotFound() },
		adapter:  func(err error) error { return cgecho.HTTPError(err) },
	}
	for _, rt := range routes {
		var mw []labecho.MiddlewareFunc
		if rt.guarded != nil {
			mw = append(mw, cgecho.Middleware(rt.guarded))
		}
		e.Add(rt.method, rt.path, func(c *labecho.Context) error {
			return rt.handle(c.Request(), c.Param("id")).write(c, m)
		}, mw...)
	}
	return e
}
