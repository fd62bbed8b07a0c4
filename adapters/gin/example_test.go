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
	r := gingonic.New()
	r.GET("/products/:id", cggin.Middleware(g), func(c *gingonic.Context) {
		name, err := guard.Get(c.Request.Context(), g, c.Param("id"), func(ctx context.Context, id string) (string, error) {
			return "Desk lamp", nil // SELECT name FROM products WHERE id = $1
		})
		if err != nil {
			cggin.Error(c, err) // 404, 400, 503 or 500 as problem+json
			return
		}
		c.String(http.StatusOK, name)
	})

	for _, path := range []string{"/products/42", "/products/7", "/products/%7Bx%7D"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(rec.Code, rec.Body.String())
	}
	// Output:
	// 200 Desk lamp
	// 404 {"type":"about:blank","title":"Not Found","status":404}
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"malformed id"}
}
