package backoff_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/backoff"
)

// TestPausesDoubleUpToMax: without jitter the pauses double from Min and
// stay at Max; a bound caps one pause without changing the steps.
func TestPausesDoubleUpToMax(t *testing.T) {
	b := backoff.New(time.Millisecond, 5*time.Millisecond, false)
	want := []time.Duration{1, 2, 4, 5, 5}
	for i, w := range want {
		if got := b.Pause(0); got != w*time.Millisecond {
			t.Fatalf("pause %d = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	b = backoff.New(4*time.Millisecond, time.Second, false)
	if got := b.Pause(time.Millisecond); got != time.Millisecond {
		t.Fatalf("bounded pause = %v", got)
	}
	if got := b.Pause(0); got != 8*time.Millisecond {
		t.Fatalf("the step after a bounded pause = %v, want 8ms", got)
	}
}

// TestJitterStaysInTheStep: a jittered pause is in (0, step].
func TestJitterStaysInTheStep(t *testing.T) {
	for range 1000 {
		b := backoff.New(time.Millisecond, time.Millisecond, true)
		if d := b.Pause(0); d <= 0 || d > time.Millisecond {
			t.Fatalf("jittered pause %v outside (0, 1ms]", d)
		}
	}
}

// TestWaitEndsOnWakeAndCtx: a wake-up or a cancelled ctx ends a long wait.
func TestWaitEndsOnWakeAndCtx(t *testing.T) {
	b := backoff.New(time.Hour, time.Hour, false)
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	if err := b.Wait(context.Background(), 0, wake); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx, 0, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a cancelled ctx = %v", err)
	}
}
