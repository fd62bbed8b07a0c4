package aside

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"
)

// OutageOptions is guard.OutageOptions (documented there).
type OutageOptions struct {
	FailFast bool
	MaxLoads int
}

// The breaker opens after breakAfter consecutive failed reads and lets one
// read probe Redis again after breakFor.
const (
	breakAfter = 5
	breakFor   = time.Second
)

// outage is a Guard's outage policy, resolved.
type outage struct {
	failFast bool
	maxLoads int
	slots    *semaphore.Weighted // one unit per load-through in flight: MaxLoads
	breaker  *gobreaker.TwoStepCircuitBreaker[struct{}]
	// troubled is set by a failed read and cleared once the breaker is
	// closed again after a success: while it is clear, reads do not
	// consult the breaker at all (it takes a mutex per call).
	troubled  atomic.Bool
	recovered func() // told when reads succeed again after failing: the replay need not wait out its backoff
	// lastSlotReload is when a cluster slot-map reload was last asked for
	// (unix nanos; see reloadSlots).
	lastSlotReload atomic.Int64
}

func newOutage(o OutageOptions, g *Engine) (*outage, error) {
	if o.MaxLoads == 0 {
		o.MaxLoads = 16
	}
	if o.MaxLoads < 0 {
		return nil, fmt.Errorf("%w: Outage %+v", ErrInvalidOptions, o)
	}
	after := uint32(breakAfter)
	return &outage{
		recovered: g.unw.wakeReplay,
		failFast:  o.FailFast,
		slots:     semaphore.NewWeighted(int64(o.MaxLoads)),
		maxLoads:  o.MaxLoads,
		breaker: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        g.name,
			MaxRequests: 1,
			Timeout:     breakFor,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= after },
			// Only Redis failing counts; ErrNotFound and the like are answers.
			IsSuccessful: func(err error) bool { return !errors.Is(err, ErrUnavailable) },
			OnStateChange: func(_ string, from, to gobreaker.State) {
				switch to {
				case gobreaker.StateOpen:
					g.stats.breakerOpens.Add(1)
				case gobreaker.StateHalfOpen: // replay failed writes as the probe goes out, not a backoff later
					g.unw.wakeReplay()
				}
				g.log.Warn("cacheguard: redis circuit breaker", "from", from.String(), "to", to.String())
			},
		}),
	}, nil
}

// errBreakerOpen is wrapped (with ErrUnavailable) by the error of a Get that
// skipped Redis because the breaker is open.
var errBreakerOpen = errors.New("circuit breaker open: not asking redis")

// before asks whether to read Redis. While no read has failed lately it
// says yes without asking the breaker (done is nil). When the breaker says
// no, err wraps ErrUnavailable. Call after with done and the read's error.
func (o *outage) before() (done func(error), err error) {
	if !o.troubled.Load() {
		return nil, nil
	}
	done, err = o.breaker.Allow()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, errBreakerOpen)
	}
	return done, nil
}

// after tells the breaker how a read went.
func (o *outage) after(done func(error), err error) {
	if done != nil {
		done(err)
		if err == nil && o.breaker.State() == gobreaker.StateClosed && o.troubled.CompareAndSwap(true, false) {
			o.recovered()
		}
		return
	}
	if errors.Is(err, ErrUnavailable) { // the first failure: count it, and consult the breaker from now on
		o.troubled.Store(true)
		if d, berr := o.breaker.Allow(); berr == nil {
			d(err)
		}
	}
}

// admit takes one of the MaxLoads load-through slots (release it with
// slots.Release(1)), or counts the Get shed and says the cap is reached.
func (o *outage) admit(g *Engine, what string) error {
	if o.slots.TryAcquire(1) {
		return nil
	}
	g.stats.shed.Add(1)
	return fmt.Errorf("cacheguard: %s%s: %w: load-through cap (%d loads at once) reached", g.name, what, ErrUnavailable, o.maxLoads)
}

// downOrRefusing reports whether err is Redis failing (ErrUnavailable) in a
// way that loading through can answer.
func downOrRefusing(err error) bool { return errors.Is(err, ErrUnavailable) }

// reply reports whether err is an error reply from Redis (NOPERM, OOM,
// WRONGTYPE...): Redis is up and refuses, which retrying will not mend.
func reply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// loadThrough answers a Get from the load function alone, without Redis:
// the outage policy. cause is the Redis failure that sent it here. Loads are
// merged per ID in this process (a flight keyed apart from the fill flights)
// under the same started-after rule as fill (join), and capped by MaxLoads.
func loadThrough[T any](ctx context.Context, g *Engine, id, vkey string, load LoadFunc[T], from since, cause error) (T, error) {
	var zero T
	if g.outage.failFast || ctx.Err() != nil { // a caller whose ctx ended (its read timed out) gets nothing from a load
		return zero, cause
	}
	j, err := joinServed(ctx, g, "\x00through:"+vkey, from, flight[T]{g: g, id: id, vkey: vkey, load: load}, (*flight[T]).runThrough, nil)
	return answerJoined(ctx, g, id, j, err, true)
}

// runThrough is the flight of a load-through: one load, no Redis.
func (c *flight[T]) runThrough(ctx context.Context) (flightResult, error) {
	g := c.g
	pass, err := g.sup.enter()
	if err != nil {
		return flightResult{outcome: outFailed}, err
	}
	defer g.sup.leave(pass)
	started := g.starts.Add(1)
	if err := g.outage.admit(g, fmt.Sprintf(" %q", c.id)); err != nil {
		return flightResult{outcome: outFailed, started: started, by: c}, err
	}
	defer g.outage.slots.Release(1)
	g.stats.loadThroughs.Add(1)
	_, _, err = c.Load(ctx)
	fl := c.found
	if err != nil {
		fl = flightResult{outcome: outFailed}
	}
	fl.started, fl.by = started, c
	if errors.Is(c.err, ErrNotFound) {
		return fl, ErrNotFound
	}
	return fl, err
}
