package guard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"
)

// Health: the one place that decides whether Redis is answering, and what a
// Get does when it is not. Three parts, each asked by every read: the
// breaker (before, after: Redis failing, so reads stop asking it) with the
// load-through cap (admit); the unwritten set (has: an ID whose write did
// not land loads through); and the check of the marks after a dial (a
// restart or failover Redis acknowledged writes across: lost.go keeps the
// marks, replay.go replays what they say was lost), which the watcher
// (watch) makes when no read comes.

// OutageOptions says what Get does when Redis cannot answer: it is down,
// times out, refuses writes under maxmemory, or an ACL refuses a command.
//
// By default Get loads through: it calls the load function directly and
// returns its value (or ErrNotFound) uncached, merged per ID in the process
// and capped across IDs by MaxLoads; a Get beyond the cap gets ErrUnavailable
// at once. Load-through is the default because the cache exists to spare the
// database, not to refuse its readers (the HTTP adapters fail open too). The
// filter is in Redis as well: unknown IDs are judged by the Guard's copy of
// it (FilterOptions.NoLocalCopy), and reach the loader, within the cap, only
// when that copy may hold them. A circuit breaker (sony/gobreaker) opens
// after 5 failed reads in a row, then lets one read probe Redis every
// 100 ms, so Gets are back on Redis within 100 ms of it answering.
type OutageOptions struct {
	// FailFast makes Get return ErrUnavailable (wrapped) instead of loading
	// through.
	FailFast bool
	// MaxLoads caps the load-through calls in flight at once, across all
	// IDs of the Guard, per process. Default 16.
	MaxLoads int
}

// The breaker opens after breakAfter consecutive failed reads and lets one
// read probe Redis every breakFor: one read per 100 ms is no load on a
// Redis in trouble, and a Redis back within milliseconds (a restart) has
// the Gets back as soon, where a second of ErrUnconfirmed (503) for the
// IDs the filter's copy never saw followed it (the chaos run, seed 1).
const (
	breakAfter = 5
	breakFor   = 100 * time.Millisecond
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

func newOutage(o OutageOptions, g *Guard) (*outage, error) {
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
			IsExcluded:   func(err error) bool { return errors.Is(err, errPeekWait) },
			// A failed probe (half-open to open) is neither counted nor
			// logged: one outage opens the breaker once.
			OnStateChange: func(_ string, from, to gobreaker.State) {
				switch {
				case to == gobreaker.StateHalfOpen: // replay failed writes as the probe goes out, not a backoff later
					g.unw.wakeReplay()
					return
				case to == gobreaker.StateOpen && from == gobreaker.StateHalfOpen:
					return
				case to == gobreaker.StateOpen:
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
		if err == nil && o.breaker.State() == gobreaker.StateClosed && o.troubled.CompareAndSwap(true, false) {
			o.recovered()
		}
		return
	}
	if errors.Is(err, ErrUnavailable) && !errors.Is(err, errPeekWait) { // the first failure: count it, and consult the breaker from now on
		o.troubled.Store(true)
		if d, berr := o.breaker.Allow(); berr == nil {
			d(err)
		}
	}
}

// admit takes one of the MaxLoads load-through slots (release it with
// slots.Release(1)), or counts the Get shed and says the cap is reached.
func (o *outage) admit(g *Guard, what string) error {
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

// unwritten is the set of IDs whose writes failed.
type unwritten struct {
	n          atomic.Int64      // len(ids), +1 while overflowed: Gets check it first, without the mutex
	mu         sync.Mutex        // guards the fields below
	ids        map[string]uint64 // ID → the number of its last failure, so a replay does not clear a newer one
	seq        uint64
	overflowed bool   // IDs were dropped: every ID counts as unwritten (see has)
	overflows  uint64 // IDs dropped so far: a drop of the entries clears overflowed only if none was since
	replaying  bool   // the replay goroutine runs (started by holdUnwritten, ended by replayOnce)
	// this replay's IDs rewritten, batches and whether it dropped every
	// entry so far: one line says them when it ends (a line per batch would
	// be held back by the rate limit).
	replayedIDs, batches int
	droppedAll           bool
	// wake, made by New (buffer 1), starts a replay attempt now: reads
	// succeed again, so the replay need not wait out its backoff.
	wake chan struct{}
	// replayed counts the replays that landed: a read that began before
	// one and ended after may hold the entry it deleted (see get).
	replayed atomic.Uint64
}

// has reports whether id's last write failed and was not yet replayed.
func (u *unwritten) has(id string) bool {
	if u.n.Load() == 0 {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.ids[id]
	return ok || u.overflowed
}

// wakeReplay cuts the replay's backoff short: Redis may answer again.
func (u *unwritten) wakeReplay() {
	select {
	case u.wake <- struct{}{}:
	default: // a wake-up is pending
	}
}

// due reports whether a check of the marks is due: a write landed, and a
// connection was dialed since the last check.
func (m *marks) due() bool { return m.wrote.Load() && m.dials.Load() != m.checked.Load() }

// A check reads every mark this Guard advanced and replays what Redis
// lost. It is due once a connection was dialed since the last one, and
// rides in the next read's round trip (queueCheck, then endCheck, before
// the read answers); a read that finds another's check in flight waits for
// it, and one whose check failed tries again alone.
type check struct {
	dials uint64
	seen  map[uint16]int64 // the marks as the Guard saw them before it asked
	gets  []*redis.StringCmd
	slots []uint16
}

// queueCheck queues a due check into pipe if no other is in flight (it
// then holds m.check until endCheck); nil otherwise.
func (g *Guard) queueCheck(ctx context.Context, pipe redis.Pipeliner) *check {
	m := g.marks
	if !m.due() || !m.check.TryLock() {
		return nil
	}
	c := &check{dials: m.dials.Load()}
	if c.dials == m.checked.Load() {
		m.check.Unlock()
		return nil
	}
	m.mu.Lock()
	c.seen = maps.Clone(m.high) // every write these count ran in Redis before the GETs
	m.mu.Unlock()
	if len(c.seen) == 0 { // nothing written yet: nothing Redis could have lost
		m.checked.Store(c.dials)
		m.check.Unlock()
		return nil
	}
	c.slots = slices.Sorted(maps.Keys(c.seen))
	c.gets = make([]*redis.StringCmd, len(c.slots))
	for i, s := range c.slots {
		c.gets[i] = pipe.Get(ctx, g.keys.Mark(m.token, s, m.cluster))
	}
	return c
}

// endCheck finishes c after its round trip (nil: none rode in it): it
// replays what Redis lost. Without c, a due check is waited for, or made
// now in a round trip of its own. A failed check is tried by the next read.
func (g *Guard) endCheck(ctx context.Context, c *check) {
	m := g.marks
	if c == nil {
		if !m.due() {
			return
		}
		m.check.Lock() // another read's check in flight: wait for it
		if m.dials.Load() == m.checked.Load() {
			m.check.Unlock()
			return
		}
		pipe := g.rdb.Pipeline()
		m.check.Unlock()
		if c = g.queueCheck(ctx, pipe); c == nil {
			return
		}
		_, _ = pipe.Exec(ctx)
	}
	defer m.check.Unlock()
	var lost []string
	overflow := false
	m.mu.Lock()
	for i, s := range c.slots {
		at, err := c.gets[i].Int64() // a mark gone (a restart without it, eviction) reads 0
		switch {
		case g.refusal(err) != "":
			m.mu.Unlock()
			m.refusedOnce.Do(func() { g.refused(ctx, "noticing writes Redis lost", err) })
			m.checked.Store(c.dials) // an ACL that refuses them: no check will pass
			return
		case err != nil && !errors.Is(err, redis.Nil):
			m.mu.Unlock()
			return
		}
		if at < c.seen[s] {
			l, o := m.lostLocked(s, at, c.seen[s])
			lost, overflow = append(lost, l...), overflow || o
		}
	}
	m.mu.Unlock()
	if len(lost) > 0 || overflow {
		g.writesLost(lost, overflow)
	}
	m.checked.Store(c.dials) // a dial during the check: the next read checks again
}

// watchEvery is how often the watcher makes sure that a restart or a
// failover of Redis is noticed while the Guard neither reads nor writes.
const watchEvery = time.Second

// watch is the watcher: a loop of the supervisor's, started by the first
// write that lands (landed) and stopped by Close (its ctx). Every
// watchEvery it touches the masters of the marks (touch) and, once they
// answer, makes the check a read would make if one is due (endCheck): the
// writes Redis lost are replayed and the filter rebuilt without any Get.
func (g *Guard) watch(ctx context.Context) {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	var masters map[*redis.Client]uint16 // touch's last, in a cluster
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		tctx, cancel := context.WithTimeout(ctx, g.opts.Tuning.RedisTimeout)
		var answered bool
		if masters, answered = g.touch(tctx, masters); answered {
			g.endCheck(tctx, nil) // while Redis does not answer, no check is tried
		}
		cancel()
	}
}

// touch sends one EXISTS of a mark to each master that holds one, and
// reports whether all answered: a pooled connection that died with a
// restart is replaced by a dial (dialCounter), which makes a check due. In
// a cluster, masters maps each master of a written slot to one such slot;
// a change since last (a failover to a node the client was connected to
// already, which dials nothing) counts as a dial too.
func (g *Guard) touch(ctx context.Context, last map[*redis.Client]uint16) (masters map[*redis.Client]uint16, answered bool) {
	m := g.marks
	cc, ok := g.rdb.(*redis.ClusterClient)
	if !ok || !m.cluster {
		return nil, g.rdb.Exists(ctx, g.keys.Mark(m.token, 0, m.cluster)).Err() == nil
	}
	m.mu.Lock()
	slots := slices.Collect(maps.Keys(m.high))
	m.mu.Unlock()
	masters = make(map[*redis.Client]uint16, len(last))
	for _, s := range slots {
		if n, err := cc.MasterForKey(ctx, g.keys.Mark(m.token, s, true)); err == nil {
			if _, ok := masters[n]; !ok {
				masters[n] = s
			}
		}
	}
	sameNodes := func(uint16, uint16) bool { return true } // any slot of a master stands for it
	if last != nil && !maps.EqualFunc(masters, last, sameNodes) {
		m.dials.Add(1)
	}
	pipe := cc.Pipeline() // one EXISTS per master, sent to each at once
	for _, s := range masters {
		pipe.Exists(ctx, g.keys.Mark(m.token, s, true))
	}
	_, err := pipe.Exec(ctx)
	if err != nil {
		g.reloadSlots(ctx, err) // a master gone: the slot map says who serves its slots now
	}
	return masters, err == nil && len(masters) > 0
}
