package echov5_test

import (
	"net/http"
	"testing"

	labecho "github.com/labstack/echo/v5"

	cgecho "github.com/cacheguard/cacheguard/adapters/echov5"
	"github.com/cacheguard/cacheguard/adapters/internal/adaptertest"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestAdapter runs the suite both Echo adapters pass (adaptertest): the
// v4 adapter's tests, on v5.
func TestAdapter(t *testing.T) { adaptertest.Run(t, v5{}) }

// v5 builds the suite's routers with Echo v5 and this adapter.
type v5 struct{}

type router struct{ *labecho.Echo }

func config(c adaptertest.Config) cgecho.Config {
	cfg := cgecho.DefaultConfig
	cfg.FailClosed, cfg.RetryAfter, cfg.OnUnfiltered = c.FailClosed, c.RetryAfter, c.OnUnfiltered
	if h := c.SkipHeader; h != "" {
		cfg.Skipper = func(c *labecho.Context) bool { return c.Request().Header.Get(h) != "" }
	}
	return cfg
}

func (v5) New(g *guard.Guard, c adaptertest.Config, get func(r *http.Request, id string) (string, error)) adaptertest.Router {
	e := labecho.New()
	e.HTTPErrorHandler = cgecho.ErrorHandler(labecho.DefaultHTTPErrorHandler(false))
	e.GET("/products/:id", func(c *labecho.Context) error {
		name, err := get(c.Request(), c.Param("id"))
		if err != nil {
			return cgecho.HTTPError(err)
		}
		return c.String(http.StatusOK, name)
	}, cgecho.MiddlewareWithConfig(g, config(c)))
	return router{e}
}

func (r router) OK(path string, g *guard.Guard, c adaptertest.Config) {
	r.GET(path, func(c *labecho.Context) error { return c.NoContent(http.StatusOK) }, cgecho.MiddlewareWithConfig(g, config(c)))
}
