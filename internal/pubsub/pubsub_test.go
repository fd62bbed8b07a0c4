package pubsub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/pubsub"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestDeliversInOrderAfterSubscribe: a message published once Subscribe has
// returned is delivered, in order; after Close none is.
func TestDeliversInOrderAfterSubscribe(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	got := make(chan string, 10)
	s, err := pubsub.Subscribe(ctx, c, c.Prefix+":ch", func(p string) { got <- p }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b", "c"} {
		if err := c.Publish(ctx, c.Prefix+":ch", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"a", "b", "c"} {
		next(t, got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The server drops the subscriber when it sees the connection close.
	redistest.Eventually(t, 5*time.Second, "no subscriber left after Close", func() bool {
		n, err := c.Publish(ctx, c.Prefix+":ch", "late").Result()
		return err == nil && n == 0
	})
}

func TestSubscribeWithRedisDown(t *testing.T) {
	ctx := context.Background()
	srv, err := redisserver.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Network: srv.Network, Addr: srv.Addr, MaxRetries: -1})
	defer rdb.Close()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = srv.Stop()
	if _, err := pubsub.Subscribe(ctx, rdb, "ch", func(string) {}, nil); !errors.Is(err, redisfail.ErrUnavailable) {
		t.Fatalf("Subscribe with Redis down: %v", err)
	}
}

// TestLostOnResubscribe: lost is not called for the first subscription;
// when Redis drops the subscriber's connection, go-redis subscribes again on
// a new one and lost is called (what was published meanwhile was not
// delivered), and a message published after that is delivered. A private
// server: killing its subscribers kills no other test's.
func TestLostOnResubscribe(t *testing.T) {
	ctx := context.Background()
	_, rdb := redistest.Private(t)
	got, lost := make(chan string, 10), make(chan struct{}, 10)
	s, err := pubsub.Subscribe(ctx, rdb, "ch", func(p string) { got <- p }, func() { lost <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	receive := func(want string) {
		t.Helper()
		if err := rdb.Publish(ctx, "ch", want).Err(); err != nil {
			t.Fatal(err)
		}
		next(t, got, want)
	}
	receive("before") // delivered after any confirmation of the first subscription
	if len(lost) != 0 {
		t.Fatal("lost called for the first subscription")
	}
	if n, err := rdb.ClientKillByFilter(ctx, "type", "pubsub").Result(); err != nil || n != 1 {
		t.Fatalf("killed %d subscribers: %v", n, err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("lost not called after the subscriber's connection was killed")
	}
	receive("after")
}

// next fails the test unless the next message delivered is want, within 5 s.
func next(t *testing.T, got <-chan string, want string) {
	t.Helper()
	select {
	case p := <-got:
		if p != want {
			t.Fatalf("got %q, want %q", p, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no message %q", want)
	}
}
