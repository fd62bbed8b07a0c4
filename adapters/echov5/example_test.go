package echov5_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	labecho "github.com/labstack/echo/v5"

	cgecho "github.com/cacheguard/cacheguard/adapters/echov5"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func ExampleMiddleware() {
	ctx := context.Background()
	rdb := redistest.NewClient() // in your app: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "example-product", nil)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	_, _ = g.Rebuild(ctx, func(yield func(string, error) bool) { yield("42", nil) }, nil)

	e := labecho.New()
	e.HTTPErrorHandler = cgecho.ErrorHandler(labecho.DefaultHTTPErrorHandler(false)) // problem+json
	e.GET("/products/:id", func(c *labecho.Context) error {
		name, err := guard.Get(c.Request().Context(), g, c.Param("id"), func(ctx context.Context, id string) (string, error) {
			return "Desk lamp", nil // SELECT name FROM products WHERE id = $1
		})
		if err != nil {
			return cgecho.HTTPError(err)
		}
		return c.String(http.StatusOK, name)
	}, cgecho.Middleware(g))

	for _, path := range []string{"/products/42", "/products/7"} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(rec.Code, rec.Body.String())
	}
	// Output:
	// 200 Desk lamp
	// 404 {"type":"about:blank","title":"Not Found","status":404}
}
