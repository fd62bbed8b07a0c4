package coord

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Trip batching. The lock attempts (with their re-checks) and the
// writes of concurrent flights go through a group commit (package batch):
// while tripsInFlight of those round trips are under way, the next ones
// wait and go together in one pipeline. Each stays its own commands, so
// the protocol is unchanged; what falls is the system calls and Redis
// event-loop turns per miss when many keys miss at once (a cold cache).
const (
	tripsInFlight = 2
	tripBatchMax  = 128
)

// queueFunc is one flight's part of a round trip: it adds its commands to
// the pipeline and keeps them to read after it ran.
type queueFunc func(ctx context.Context, pipe redis.Pipeliner)

// runTrips sends calls' commands in one pipeline. One carrying other
// flights' commands runs on the leading flight's ctx without its
// cancellation (they wait for it), bounded by OpTimeout.
func (c *Coordinator) runTrips(ctx context.Context, calls []*batch.Call[queueFunc]) {
	if len(calls) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = c.op(ctx)
		defer cancel()
	}
	pipe := c.rdb.Pipeline()
	for _, call := range calls {
		call.Req(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
}

// send runs queue's commands in a round trip, perhaps shared with other
// flights'. If ctx ends first it returns the error wrapping
// redisfail.ErrUnavailable, and queue's commands may still be sent later:
// the caller must not read what queue keeps then (the scripts are safe to
// run late: a write whose lock is gone is refused, a release checks
// its token).
func (c *Coordinator) send(ctx context.Context, queue queueFunc) error {
	call := &batch.Call[queueFunc]{Req: queue}
	if err := c.trips.Do(ctx, call); err != nil {
		return redisfail.Wrap(err)
	}
	return nil
}
