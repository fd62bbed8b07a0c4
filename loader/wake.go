package loader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// errClosed is returned by register after close.
var errClosed = errors.New("loader: coordinator closed")

// waker fans one Redis pub/sub subscription out to the flights of this
// process that wait for a key: one SUBSCRIBE per Coordinator, opened on the
// first wait, however many keys and flights wait.
type waker struct {
	rdb     redis.UniversalClient
	channel string

	mu      sync.Mutex                            // guards the fields below
	waiters map[string]map[chan struct{}]struct{} // key → channels to close on its message
	ps      *redis.PubSub                         // nil until the first register
	done    chan struct{}                         // closed when dispatch has returned
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
	if w.ps == nil {
		ps := w.rdb.Subscribe(ctx, w.channel)
		if _, err := ps.Receive(ctx); err != nil {
			_ = ps.Close()
			return nil, nil, fmt.Errorf("loader: subscribe %s: %w", w.channel, err)
		}
		w.ps, w.done, w.waiters = ps, make(chan struct{}), map[string]map[chan struct{}]struct{}{}
		go w.dispatch(ps.Channel(), w.done) // ends when close closes ps
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

// dispatch wakes the waiters of each key named by a message. go-redis
// reconnects and resubscribes the PubSub by itself; messages published while
// it does are lost, which is why waiters also wake on a timer.
func (w *waker) dispatch(msgs <-chan *redis.Message, done chan<- struct{}) {
	defer close(done)
	for m := range msgs {
		w.mu.Lock()
		for c := range w.waiters[m.Payload] {
			close(c)
		}
		delete(w.waiters, m.Payload)
		w.mu.Unlock()
	}
}

func (w *waker) publish(ctx context.Context, key string) error {
	return w.rdb.Publish(ctx, w.channel, key).Err()
}

// close ends the subscription and waits for dispatch to return.
func (w *waker) close() error {
	w.mu.Lock()
	w.closed = true
	ps, done := w.ps, w.done
	w.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}
