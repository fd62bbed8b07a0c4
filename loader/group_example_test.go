package loader_test

import (
	"context"
	"fmt"

	"github.com/cacheguard/cacheguard/loader"
)

// DoOnJoin tells a caller that it joined a flight under way, before it
// waits: the moment to give up what that flight may need.
func ExampleGroup_DoOnJoin() {
	var g loader.Group[string, string]
	started, joined := make(chan struct{}), make(chan struct{})
	done := make(chan string)
	go func() {
		v, _, _ := g.Do(context.Background(), "k", func(ctx context.Context) (string, error) {
			close(started)
			<-joined // waits for what the joiner gives up
			return "shared", nil
		})
		done <- v
	}()
	<-started
	v, shared, _ := g.DoOnJoin(context.Background(), "k", func(ctx context.Context) (string, error) {
		return "never runs", nil
	}, func() { close(joined) })
	fmt.Println(v, shared, <-done)
	// Output: shared true shared
}

// Go starts a flight nobody waits for, as a refresh ahead of expiry does: a
// second Go of the key while it runs starts nothing, and a Do joins it.
func ExampleGroup_Go() {
	var g loader.Group[string, string]
	release := make(chan struct{})
	refresh := func(ctx context.Context) (string, error) {
		<-release
		return "fresh", nil
	}
	fmt.Println(g.Go(context.Background(), "user:42", refresh))
	fmt.Println(g.Go(context.Background(), "user:42", refresh))
	v, shared, _ := g.DoOnJoin(context.Background(), "user:42", refresh, func() { close(release) })
	fmt.Println(v, shared)
	// Output:
	// true
	// false
	// fresh true
}
