package redisfail_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

func TestWrap(t *testing.T) {
	if redisfail.Wrap(nil) != nil {
		t.Fatal("Wrap(nil) != nil")
	}
	if err := redisfail.Wrap(redis.Nil); err != redis.Nil {
		t.Fatalf("Wrap(redis.Nil) = %v, want redis.Nil itself", err)
	}
	base := errors.New("dial tcp: connection refused")
	once := redisfail.Wrap(base)
	if !errors.Is(once, redisfail.ErrUnavailable) || !errors.Is(once, base) {
		t.Fatalf("Wrap(%v) = %v: must wrap both", base, once)
	}
	if twice := redisfail.Wrap(once); twice != once {
		t.Fatalf("wrapped twice: %v", twice)
	}
	if err := redisfail.Wrap(context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, redisfail.ErrUnavailable) {
		t.Fatalf("a deadline while waiting for Redis: %v", err)
	}
}
