package aside_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cacheguard/cacheguard/internal/aside"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// An Engine is what a guard.Guard runs on: guard.New opens one, guard.Get
// calls aside.Get.
func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	e, err := aside.New(ctx, rdb, "example-aside", &aside.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	load := func(_ context.Context, id string) (string, error) { return "value of " + id, nil }
	v, err := aside.Get(ctx, e, "42", load) // the filter is not built: it fails open, and loads
	fmt.Println(v, err)
	// Output: value of 42 <nil>
}
