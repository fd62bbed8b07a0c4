package main

import (
	"net/http"

	labecho "github.com/labstack/echo/v4"

	cgecho "github.com/cacheguard/cacheguard/adapters/echo"
)

// routerV4 serves the routes on Echo v4 with the v4 adapter (shop -echo 4).
func routerV4(routes []route) http.Handler {
	e := labecho.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = cgecho.ErrorHandler(e.DefaultHTTPErrorHandler)
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
		e.Add(rt.method, rt.path, func(c labecho.Context) error {
			return rt.handle(c.Request(), c.Param("id")).write(c, m)
		}, mw...)
	}
	return e
}
