package pubsub_test

import (
	"context"
	"fmt"

	"github.com/cacheguard/cacheguard/internal/pubsub"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func ExampleSubscribe() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	got := make(chan string, 1)
	s, err := pubsub.Subscribe(ctx, rdb, "example:invalidated", func(key string) { got <- key }, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	rdb.Publish(ctx, "example:invalidated", "cg:product:{42}")
	fmt.Println(<-got)
	// Output: cg:product:{42}
}
