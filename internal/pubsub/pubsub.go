// Package pubsub is the one Redis pub/sub subscriber of cacheguard: a Guard's
// in-process cache listens for invalidations with it, and the loader's waiters
// listen for finished loads. Each is one SUBSCRIBE, fanned out in-process by
// the handler it was given.
package pubsub

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Subscription delivers the messages of one channel to a handler, in order,
// from one goroutine that Subscribe starts and Close waits for. go-redis
// resubscribes by itself after a dropped connection; messages published
// meanwhile are lost, and the subscription says so (lost) once it is back.
type Subscription struct {
	ps   *redis.PubSub
	done chan struct{} // closed when the delivering goroutine has returned
}

// Subscribe subscribes to channel and returns once Redis has confirmed it:
// a message published after Subscribe returns reaches handle. lost, if not
// nil, is called from the same goroutine each time go-redis has subscribed
// again on a new connection: messages published while it was down were not
// delivered, and one published after lost returns will be. Redis failures
// wrap redisfail.ErrUnavailable.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, channel string, handle func(payload string), lost func()) (*Subscription, error) {
	ps := rdb.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil { // the first confirmation: later ones are resubscriptions
		_ = ps.Close()
		return nil, fmt.Errorf("subscribe %s: %w", channel, redisfail.Wrap(err))
	}
	s := &Subscription{ps: ps, done: make(chan struct{})}
	msgs := ps.ChannelWithSubscriptions()
	go func() {
		defer close(s.done)
		for m := range msgs { // ends when Close closes ps
			switch m := m.(type) {
			case *redis.Message:
				handle(m.Payload)
			case *redis.Subscription:
				if m.Kind == "subscribe" && lost != nil {
					lost()
				}
			}
		}
	}()
	return s, nil
}

// Close ends the subscription and waits until the handler is no longer called.
func (s *Subscription) Close() error {
	err := s.ps.Close()
	<-s.done
	return err
}
