package batch_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/cacheguard/cacheguard/internal/batch"
)

func ExampleBatcher_Do() {
	type upper struct{ in, out string }
	b := batch.New(1, 64, func(_ context.Context, calls []*batch.Call[upper]) {
		// One round trip would carry all of them here.
		for _, c := range calls {
			c.Req.out = strings.ToUpper(c.Req.in)
		}
	}, nil)
	c := &batch.Call[upper]{Req: upper{in: "sku-1"}}
	if err := b.Do(context.Background(), c); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Req.out)
	// Output: SKU-1
}
