package gin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	gingonic "github.com/gin-gonic/gin"

	cggin "github.com/cacheguard/cacheguard/adapters/gin"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func ExampleMiddleware() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: the client README.md sets up
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-product", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)

	gingonic.SetMode(gingonic.ReleaseMode)
	r := newRouter(g)

	for _, path := range []string{"/products/42", "/products/7", "/products/a%2Fb"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(rec.Code, rec.Body.String())
	}
	// Output:
	// 200 Desk lamp
	// 404 {"type":"about:blank","title":"Not Found","status":404}
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"malformed id"}
}

// newRouter is the application's router: a product route behind the
// middleware, on an engine from newEngine.
func newRouter(g *guard.Guard) *gingonic.Engine {
	r := newEngine()
	// GET and HEAD, as net/http's "GET /products/{id}": a HEAD of an unknown ID is the 404 of a GET.
	r.Match([]string{http.MethodGet, http.MethodHead}, "/products/:id", cggin.Middleware(g), func(c *gingonic.Context) {
		name, err := guard.Get(c.Request.Context(), g, c.Param("id"), func(ctx context.Context, id string) (string, error) {
			return "Desk lamp", nil // SELECT name FROM products WHERE id = $1
		})
		if err != nil {
			cggin.Error(c, err) // 404, 400, 503 or 500 as problem+json
			return
		}
		c.String(http.StatusOK, name)
	})
	return r
}

// newEngine is gin.New with the settings under which Gin answers as
// net/http's ServeMux does (TestExampleRouterAnswersAsNetHTTP compares them).
func newEngine() *gingonic.Engine {
	r := gingonic.New()
	r.UseRawPath = true             // route the raw path: "a%2Fb" reaches the middleware (400), not Gin's 404
	r.UnescapePathValues = true     // the default: c.Param is decoded, as r.PathValue ("%34%32" is "42")
	r.RedirectTrailingSlash = false // "/products/1/" is a 404, as on net/http, not a 301 to "/products/1"
	r.HandleMethodNotAllowed = true // a POST is a 405 with Allow: GET, HEAD, as on net/http, not a 404
	return r
}
