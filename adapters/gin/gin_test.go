package gin_test

import (
	"net/http"
	"testing"

	gingonic "github.com/gin-gonic/gin"

	cggin "github.com/cacheguard/cacheguard/adapters/gin"
	"github.com/cacheguard/cacheguard/adapters/internal/adaptertest"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) {
	gingonic.SetMode(gingonic.ReleaseMode) // no route listing on stdout
	redistest.Main(m)
}

// TestAdapter runs the suite every adapter passes (adaptertest).
func TestAdapter(t *testing.T) { adaptertest.Run(t, framework{}) }

// framework builds the suite's routers with Gin and this adapter (Gin's
// paths are in Echo's syntax already).
type framework struct{}

type router struct{ *gingonic.Engine }

func config(c adaptertest.Config) cggin.Config {
	cfg := cggin.Config{}
	cfg.FailClosed, cfg.RetryAfter, cfg.OnUnfiltered = c.FailClosed, c.RetryAfter, c.OnUnfiltered
	if h := c.SkipHeader; h != "" {
		cfg.Skipper = func(c *gingonic.Context) bool { return c.GetHeader(h) != "" }
	}
	return cfg
}

func (framework) New(g *guard.Guard, c adaptertest.Config, get func(r *http.Request, id string) (string, error)) adaptertest.Router {
	e := newEngine() // the example's settings: "/products/..%2Fx" reaches the middleware's 400
	e.GET("/products/:id", cggin.MiddlewareWithConfig(g, config(c)), func(c *gingonic.Context) {
		name, err := get(c.Request, c.Param("id"))
		if err != nil {
			cggin.Error(c, err)
			return
		}
		c.String(http.StatusOK, name)
	})
	return router{e}
}

func (r router) OK(path string, g *guard.Guard, c adaptertest.Config) {
	r.GET(path, cggin.MiddlewareWithConfig(g, config(c)), func(c *gingonic.Context) { c.Status(http.StatusOK) })
}
