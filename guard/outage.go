package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// OutageOptions says what Get does when Redis cannot answer: it is down,
// times out, refuses writes under maxmemory, or an ACL refuses a command.
//
// By default Get loads through: it calls the load function directly and
// returns its value (or ErrNotFound) uncached, merged per ID in the process
// and capped across IDs by MaxLoads; a Get beyond the cap gets ErrUnavailable
// at once. Load-through is the default because the cache exists to spare the
// database, not to refuse its readers (the HTTP adapters fail open too). The
// filter is in Redis as well, so unknown IDs reach the loader, within the
// cap. A circuit breaker (sony/gobreaker) opens after breakAfter failed
// reads in a row, keeps Gets off Redis for breakFor, then lets one probe.
type OutageOptions struct {
	// FailFast makes Get return ErrUnavailable (wrapped) instead of loading
	// through.
	FailFast bool
	// MaxLoads caps the load-through calls in flight at once, across all
	// IDs of the Guard, per process. Default 16.
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
	slots    chan struct{} // one token per load-through in flight: the cap
	breaker  *gobreaker.TwoStepCircuitBreaker[struct{}]
	// troubled is set by a failed read and cleared once the breaker is
	// closed again after a success: while it is clear, reads do not
	// consult the breaker at all (it takes a mutex per call).
	troubled atomic.Bool
}

func newOutage(o OutageOptions, g *Guard) (*outage, error) {
	if o.MaxLoads == 0 {
		o.MaxLoads = 16
	}
	if o.MaxLoads < 0 {
		return nil, fmt.Errorf("%w: Outage %+v", ErrInvalidOptions, o)
	}
	after := uint32(breakAfter)
	return &outage{
		failFast: o.FailFast,
		slots:    make(chan struct{}, o.MaxLoads),
		breaker: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        g.name,
			MaxRequests: 1,
			Timeout:     breakFor,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= after },
			// Only Redis failing counts; ErrNotFound and the like are answers.
			IsSuccessful: func(err error) bool { return !errors.Is(err, ErrUnavailable) },
			OnStateChange: func(_ string, from, to gobreaker.State) {
				if to == gobreaker.StateOpen {
					g.stats.breakerOpens.Add(1)
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
		if err == nil && o.breaker.State() == gobreaker.StateClosed {
			o.troubled.Store(false)
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
func loadThrough[T any](ctx context.Context, g *Guard, id, vkey string, load LoadFunc[T], from since, cause error) (T, error) {
	var zero T
	if g.outage.failFast || ctx.Err() != nil { // a caller whose ctx ended (its read timed out) gets nothing from a load
		return zero, cause
	}
	var (
		c                   *call[T]
		fl                  flight
		shared, mine, older bool
		err                 error
	)
	for attempt := 0; attempt == 0 || older && attempt <= 3; attempt++ { // an older flight's answer may predate a write (join)
		c, fl, shared, mine, older, err = join(ctx, g, "\x00through:"+vkey, from, call[T]{g: g, id: id, vkey: vkey, load: load}, (*call[T]).loadThrough)
	}
	g.answered(ctx, fl.outcome, shared && !mine, true)
	if err != nil {
		return zero, panicked(g, id, err)
	}
	if mine && c.decoded {
		return c.v, nil
	}
	return decodeFrame[T](g, id, fl.frame)
}

// loadThrough is the flight of a load-through: one load, no Redis.
func (c *call[T]) loadThrough(ctx context.Context) (flight, error) {
	g := c.g
	pass, err := g.gate.enter()
	if err != nil {
		return flight{outcome: outFailed}, err
	}
	defer g.gate.leave(pass)
	started := g.starts.Add(1)
	select {
	case g.outage.slots <- struct{}{}:
		defer func() { <-g.outage.slots }()
	default:
		g.stats.shed.Add(1)
		return flight{outcome: outFailed, started: started, by: c}, fmt.Errorf("cacheguard: %s %q: %w: load-through cap (%d loads at once) reached",
			g.name, c.id, ErrUnavailable, cap(g.outage.slots))
	}
	g.stats.loadThroughs.Add(1)
	_, _, err = c.Load(ctx)
	fl := c.found
	if err != nil {
		fl = flight{outcome: outFailed}
	}
	fl.started, fl.by = started, c
	if errors.Is(c.err, ErrNotFound) {
		return fl, ErrNotFound
	}
	return fl, err
}
