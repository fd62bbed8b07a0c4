// Package backoff is the one pause between retries in cacheguard: it
// starts at Min and doubles up to Max, with full jitter when asked (a
// pause drawn uniformly from (0, the step]), so that processes retrying
// the same thing spread out. Wait pauses for the next step, or less when a
// bound or a wake-up says so, and stops early when ctx ends.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the state of one retry loop. The zero value is not usable:
// make one with New.
type Backoff struct {
	next, max time.Duration
	jitter    bool
}

// New returns a Backoff whose first pause is first (at least 1 ns),
// doubling up to most, jittered if jitter.
func New(first, most time.Duration, jitter bool) *Backoff {
	first = max(first, 1)
	return &Backoff{next: first, max: max(most, first), jitter: jitter}
}

// Pause returns the next pause, at most bound when bound > 0, and moves on
// to the next step.
func (b *Backoff) Pause(bound time.Duration) time.Duration {
	d := b.next
	if b.jitter {
		d = time.Duration(rand.Int64N(int64(d)) + 1)
	}
	if bound > 0 {
		d = min(d, bound)
	}
	b.next = min(2*b.next, b.max)
	return d
}

// Wait pauses for Pause(bound), returning early with nil when wake (if not
// nil) receives, or with ctx's error when ctx ends.
func (b *Backoff) Wait(ctx context.Context, bound time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(b.Pause(bound))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
