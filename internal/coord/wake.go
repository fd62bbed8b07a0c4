package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/pubsub"
)

// errClosed is returned by register after close.
var errClosed = errors.New("coord: coordinator closed")

// waker fans one Redis pub/sub subscription out to the flights of this
// process that wait for a key: one SUBSCRIBE per Coordinator, opened on the
// first wait, however many keys and flights wait.
type waker struct {
	rdb     redis.UniversalClient
	channel string

	mu      sync.Mutex                            // guards the fields below
	waiters map[string]map[chan struct{}]struct{} // key → channels to close on its message
	sub     *pubsub.Subscription                  // nil until the first register
	closed  bool
}

// register returns a channel that is closed when a message for key arrives.
// The subscription is confirmed before register returns, so a message
// published after that cannot be missed (short of a dropped connection,
// which the caller covers with a timer). cancel forgets the registration.
func (w *waker) register(ctx context.Context, key string) (ch <-chan struct{}, cancel func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, nil, errClosed
	}
	if w.sub == nil {
		sub, err := pubsub.Subscribe(ctx, w.rdb, w.channel, w.dispatch)
		if err != nil {
			return nil, nil, fmt.Errorf("coord: %w", err)
		}
		w.sub, w.waiters = sub, map[string]map[chan struct{}]struct{}{}
	}
	c := make(chan struct{})
	if w.waiters[key] == nil {
		w.waiters[key] = map[chan struct{}]struct{}{}
	}
	w.waiters[key][c] = struct{}{}
	return c, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if set := w.waiters[key]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(w.waiters, key)
			}
		}
	}, nil
}

// dispatch wakes the waiters of the key a message names. It runs on the
// subscription's goroutine.
func (w *waker) dispatch(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.waiters[key] {
		close(c)
	}
	delete(w.waiters, key)
}

// close ends the subscription and waits until dispatch is no longer called.
func (w *waker) close() error {
	w.mu.Lock()
	w.closed = true
	sub := w.sub
	w.mu.Unlock()
	if sub == nil {
		return nil
	}
	return sub.Close()
}
