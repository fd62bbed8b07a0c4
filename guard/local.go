package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/pubsub"
)

// LocalOptions turns on an in-process cache in front of Redis: values this
// process read or loaded are served from memory, with no round trip, each
// copy for up to TTL after the read that made it and never past its entry's
// TTL in Redis. The first hit in the last fifth of that TTL reads the entry
// again in the background while every caller keeps hitting the copy: a key
// read often waits on Redis only when its entry expires (or is due for a
// refresh ahead). This process's writes drop or replace its copy
// before they return; other processes drop theirs when the write's pub/sub
// message arrives (milliseconds; a lost one is bounded by the subscription's
// reconnection, which drops every copy, and by TTL): without Local the
// guarantee is exact. Copies are kept decoded where the type allows, each
// caller getting its own (docs/design.md, Local cache).
type LocalOptions struct {
	// Size caps the values kept; when full, otter's adaptive W-TinyLFU picks
	// what goes (it keeps what is read often and recently). Default 10,000.
	Size int
	// TTL is how long a copy is served at most after its read: a copy also
	// never outlives its entry's TTL in Redis. Default 1 second.
	TTL time.Duration
}

// local is the in-process cache: otter holds the copies, keyed by ID (a
// local hit builds no value key); the invalidation subscription and the
// epochs keep them right.
type local struct {
	c    *otter.Cache[string, *localEntry]
	ttl  time.Duration
	idOf func(vkey string) (string, bool) // the ID an invalidation message (a value key) names
	// epoch counts the invalidations this process heard of or made (and the
	// (re)subscriptions, and messages naming no key of this Guard); a read
	// takes it before it starts (see put). heard holds, per stripe of IDs,
	// the count at their last invalidation, and floor the count at the last
	// (re)subscription: a copy read before either is not kept after it. A
	// write to one key stops the reads in flight of its stripe alone.
	epoch atomic.Uint64
	floor atomic.Uint64
	heard [epochStripes]atomic.Uint64
	seed  maphash.Seed

	// sub delivers invalidation messages (its goroutine calls invalidated).
	// Until it is set the cache is unarmed: get misses and put keeps
	// nothing, since no invalidation could reach a copy.
	sub   atomic.Pointer[pubsub.Subscription]
	armMu sync.Mutex // serializes arm and close

	renewals atomic.Int32 // renewals in flight (see renewsInFlight)
}

// epochStripes is how many stripes of IDs have an epoch of their own: two
// IDs share one with odds of 1 in 1,024, and then a write to either stops
// the other's reads in flight from keeping their copies.
const epochStripes = 1 << 10

// localEntry is one copy: its frame, the decoded value when the type
// allows handing it out without a decode (see kept), how long it may live
// and until when, and when a hit renews it.
type localEntry struct {
	frame []byte
	value any // a T (shareable types), a copied[T] (types copied per caller), or nil: decode
	life  time.Duration
	end   time.Time // when it stops being served (otter's expiry is set from it: see newLocal)
	// gone: the copy dies with its entry in Redis, at end; otter keeps it
	// goneGrace longer, so that a Get that finds it past end knows Redis has
	// nothing to read either.
	gone     bool
	dueLeft  time.Duration // a hit that finds this little of its life left renews it (see renew); 0: never
	renewing atomic.Bool   // a hit has started its renewal
}

// goneGrace is how long a copy that lived as long as its Redis entry is
// remembered after both expired: a Get then skips the read, which would
// miss, and goes straight to the lock attempt. Short, because a copy kept
// while another process reloaded the entry costs a lock where a read hits.
const goneGrace = 100 * time.Millisecond

// renewShare: a copy whose life the local TTL bounds is due for renewal in
// its last 1/renewShare to 1/(2·renewShare), chosen at random per copy so
// that copies made together do not come due together; a key read then never
// lapses. At most renewsInFlight run at once (a due copy beyond them lapses).
// A copy whose entry or refresh-at time ends it first is not renewed.
const (
	renewShare     = 5
	renewsInFlight = 256
)

// newLocal returns an unarmed local cache; arm subscribes it. idOf maps the
// value keys of invalidation messages to IDs.
func newLocal(o LocalOptions, idOf func(vkey string) (string, bool)) (*local, error) {
	o.Size = cmp.Or(o.Size, 10_000)
	o.TTL = cmp.Or(o.TTL, time.Second)
	if o.Size < 0 || o.TTL < 0 {
		return nil, fmt.Errorf("%w: Local %+v", ErrInvalidOptions, o)
	}
	c, err := otter.New(&otter.Options[string, *localEntry]{
		MaximumSize: o.Size,
		// Counted from otter's clock reading at the write: get compares
		// what is left with otter's reading at the hit, and reads no clock.
		ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, *localEntry]) time.Duration {
			if e.Value.gone {
				return time.Until(e.Value.end) + goneGrace
			}
			return time.Until(e.Value.end)
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: Local: %w", ErrInvalidOptions, err)
	}
	return &local{c: c, ttl: o.TTL, idOf: idOf, seed: maphash.MakeSeed()}, nil
}

// arm subscribes to the invalidation channel (once; again after a failure),
// so the cache starts keeping copies.
func (l *local) arm(ctx context.Context, rdb redis.UniversalClient, channel string) error {
	l.armMu.Lock()
	defer l.armMu.Unlock()
	if l.sub.Load() != nil {
		return nil
	}
	sub, err := pubsub.Subscribe(ctx, rdb, channel, l.invalidated, l.resubscribed)
	if err != nil {
		return err
	}
	raise(&l.floor, l.epoch.Add(1)) // copies read before the subscription cannot be kept
	l.sub.Store(sub)
	return nil
}

// invalidated applies an invalidation message (a value key). A message
// that names no value key of this Guard drops nothing, but no read in
// flight keeps its copy.
func (l *local) invalidated(vkey string) {
	if id, ok := l.idOf(vkey); ok {
		l.drop(id)
		return
	}
	raise(&l.floor, l.epoch.Add(1))
}

// resubscribed drops every copy, and every read in flight's, once the
// subscription is made again on a new connection: the messages published
// while it was down are lost.
func (l *local) resubscribed() {
	raise(&l.floor, l.epoch.Add(1))
	l.c.InvalidateAll()
}

// drop drops id's copy under a new epoch of its stripe: a read of id made
// before cannot keep its copy after.
func (l *local) drop(id string) {
	raise(l.stripe(id), l.epoch.Add(1))
	l.c.Invalidate(id)
}

// stripe is the epoch of id's stripe (see local.heard).
func (l *local) stripe(id string) *atomic.Uint64 {
	return &l.heard[maphash.String(l.seed, id)%epochStripes]
}

// changed reports whether a stripe (see stripe) heard of an invalidation,
// or the subscription was made, after epoch was read.
func (l *local) changed(stripe *atomic.Uint64, epoch uint64) bool {
	return max(stripe.Load(), l.floor.Load()) > epoch
}

// raise makes a at least n: two invalidations may store theirs out of order.
func raise(a *atomic.Uint64, n uint64) {
	for o := a.Load(); o < n && !a.CompareAndSwap(o, n); o = a.Load() {
	}
}

// close ends the subscription and otter's clean-up goroutine (it would end
// by itself once the cache is collected; Close makes it prompt).
func (l *local) close() error {
	l.armMu.Lock()
	defer l.armMu.Unlock()
	l.c.InvalidateAll()
	l.c.StopAllGoroutines()
	if sub := l.sub.Load(); sub != nil {
		return sub.Close()
	}
	return nil
}

// localHit answers id from the in-process cache if it holds a copy. It runs
// outside the close gate's count (it touches no Redis connection, and otter
// stays safe to read while Close empties it) and answers nothing once Close
// has begun. IDs are not checked: a malformed one was never stored.
func localHit[T any](ctx context.Context, g *Guard, id string) (T, localState) {
	if g.sup.closed.Load() {
		var zero T
		return zero, localNone
	}
	v, st := fromLocal[T](g, id)
	if st == localFresh {
		g.answered(ctx, outLocalHit, false, false)
	}
	return v, st
}

// fromLocal is the copy of id in process memory, if there is one that
// decodes (one that does not is dropped). The first hit that finds it due
// renews it (see renew).
func fromLocal[T any](g *Guard, id string) (T, localState) {
	var zero T
	e, st := g.local.get(id)
	if st != localFresh {
		return zero, st
	}
	g.stats.localHits.pace(e.at)
	if e.due && !e.renewing.Load() && g.local.renewals.Load() < renewsInFlight && e.renewing.CompareAndSwap(false, true) {
		renew[T](g, id)
	}
	if v, ok := e.value.(T); ok { // decoded once; assignment copies it all
		return v, localFresh
	}
	if c, ok := e.value.(copied[T]); ok { // decoded once, a deep copy for each caller
		return c.copy(c.v), localFresh
	}
	var v T
	if codec.Decode(g.opts.Codec, e.frame, &v) == nil {
		return v, localFresh
	}
	g.local.c.Invalidate(id)
	return zero, localNone
}

// localState is what the local cache holds for an ID.
type localState uint8

const (
	localNone  localState = iota // no copy
	localFresh                   // a copy to serve
	localGone                    // a copy whose entry has expired in Redis (see goneGrace)
)

// localFound is a copy get found, whether it is due for renewal, and the
// clock reading of the lookup (otter's: monotonic nanoseconds).
type localFound struct {
	*localEntry
	due bool
	at  int64
}

// A local hit waits on nothing, so callers that ask again at once never
// park: with more of them than processors the scheduler preempts each after
// 10 ms, and a Get preempted in the middle waits for every other caller's
// slice (hundreds of ms with 32 callers on 2 cores), as does the goroutine
// that refills the entry. So a hit yields the processor when goroutines
// wait for one and its caller's stripe (see stripes.pace) has not looked for
// yieldPeriod: slices are about that long, and the check costs the same per
// second whatever the hit rate. docs/benchmarks.md has the cost and the
// effect (Hot key, clients asking at once).
const yieldPeriod = int64(500 * time.Microsecond)

// get finds id's copy. What is left of its life comes from otter's clock
// reading for the lookup: a hit reads no other clock.
func (l *local) get(id string) (localFound, localState) {
	if l.sub.Load() == nil {
		return localFound{}, localNone
	}
	oe, ok := l.c.GetEntry(id)
	if !ok {
		return localFound{}, localNone
	}
	e, left := oe.Value, time.Duration(oe.ExpiresAtNano-oe.SnapshotAtNano)
	if e.gone && left <= goneGrace {
		return localFound{}, localGone
	}
	return localFound{e, left <= e.dueLeft, oe.SnapshotAtNano}, localFresh
}

// lifetime is what Redis said of an entry's TTL: ttl (0: unknown),
// counted from sent, a clock read before the round trip that wrote or read it.
type lifetime struct {
	ttl  time.Duration
	sent time.Time
}

// put keeps a copy for min(TTL, what is left of the entry's lifetime in
// Redis), unless an invalidation of id's stripe (or a resubscription) came
// after epoch was read (before the read that found frame). The lifetime
// counts from its sent, a clock read before the round trip that wrote or
// read it: Redis counts it from later, so the copy never outlives its
// entry. The epoch check and the store are one step under the key's lock
// in otter, which drop's Invalidate takes after raising the epoch: no copy
// read before a write is ever served after it, not even for an instant.
func (l *local) put(id string, frame []byte, value any, entry lifetime, epoch uint64) {
	now := time.Now() // one reading: the copy ends by sent + ttl
	redisTTL := entry.ttl
	if redisTTL > 0 {
		redisTTL -= now.Sub(entry.sent)
	}
	stripe := l.stripe(id)
	if l.sub.Load() == nil || redisTTL <= 0 || l.changed(stripe, epoch) {
		return
	}
	life := min(l.ttl, redisTTL)
	gone := redisTTL <= l.ttl // it dies with its entry (unless refresh-at comes first)
	var dueLeft time.Duration
	if !gone {
		dueLeft = life/(2*renewShare) + time.Duration(rand.Int64N(int64(life/(2*renewShare))+1))
	}
	// A frame with a refresh-at time (RefreshAhead) is kept only until then
	// (past it, not at all): the Get after it reads Redis and starts the
	// refresh, so a hot key served from memory does not expire under its readers.
	if at, ok := codec.RefreshAt(frame); ok {
		if until := at.Sub(now); until < life {
			life, gone, dueLeft = until, false, 0
		}
	}
	if life <= 0 {
		return
	}
	e := &localEntry{frame: frame, value: value, life: life, end: now.Add(life), gone: gone, dueLeft: dueLeft}
	l.c.Compute(id, func(*localEntry, bool) (*localEntry, otter.ComputeOp) {
		if l.changed(stripe, epoch) { // under the key's lock, which drop's Invalidate takes after raising the epoch
			return nil, otter.CancelOp
		}
		return e, otter.WriteOp
	})
}

// renew reads id's entry again (its HGET and PTTL, no probe: the ID has
// a copy) in a goroutine of the supervisor's, for a copy due for renewal:
// its callers keep hitting the copy meanwhile, and what the read finds
// replaces it, under put's epoch check. A read that fails leaves the copy to
// lapse at its end, when the next Get reads Redis itself; one that finds no
// value drops it.
func renew[T any](g *Guard, id string) {
	g.local.renewals.Add(1)
	if !g.sup.goRun(func(ctx context.Context) {
		defer g.local.renewals.Add(-1)
		vkey, err := g.keys.Value(id)               // a malformed ID was never kept
		if err != nil || g.outage.troubled.Load() { // Redis failing lately: no renewal may be the breaker's probe
			return
		}
		ctx, cancel := context.WithTimeout(ctx, g.opts.Tuning.RedisTimeout)
		defer cancel()
		done, err := g.outage.before()
		if err != nil { // the breaker is open: Redis is not asked
			return
		}
		epoch, replays := g.local.epoch.Load(), g.unw.replayed.Load() // before the read: see put, and get
		c := g.rd.calls.Get().(*batch.Call[readReq])
		c.Req = readReq{id: id, vkey: vkey, withTTL: true}
		c.Req.deadline, _ = ctx.Deadline()
		sent := time.Now()
		err = g.sendRead(ctx, c)
		var raw []byte
		var ttl time.Duration
		if err == nil { // else c may still be answered: not reused
			raw, err = c.Req.get.Bytes()
			ttl = max(c.Req.pttl.Val(), 0)
			c.Req = readReq{}
			g.rd.calls.Put(c)
		}
		if errors.Is(err, redis.Nil) { // no entry: raw is nil, and dropped below
			err = nil
		} else if err != nil {
			err = g.readFailed(ctx, "renew", id, err)
		}
		g.outage.after(done, err)
		var v T
		switch {
		case err != nil: // the copy lapses at its end
		case g.unw.has(id), g.unw.replayed.Load() != replays: // the entry may be one a lost write replaced: get skips the copy
		case codec.Decode(g.opts.Codec, raw, &v) == nil:
			g.local.put(id, raw, kept(g, v), lifetime{ttl: ttl, sent: sent}, epoch)
		default: // no entry, a marker, or one this T cannot read: the next Get reads it
			g.local.c.Invalidate(id)
		}
	}) {
		g.local.renewals.Add(-1) // closed: not started
	}
}

// kept returns what the local cache keeps of v, which a caller also gets (or,
// for Set, the application still holds): v itself for a type whose copies
// share nothing, a private deep copy with the copier that makes each
// caller's own (copied), or nil when the type can only be decoded each time.
func kept[T any](g *Guard, v T) any {
	switch b := g.bound.Load(); {
	case b == nil:
		return nil
	case b.shareable:
		return v
	case b.copy != nil:
		fn := b.copy.(func(T) T)
		return copied[T]{v: fn(v), copy: fn}
	}
	return nil
}

// copied is what the local cache keeps of a value whose type needs a deep
// copy per caller: nobody outside the cache reaches v.
type copied[T any] struct {
	v    T
	copy func(T) T
}

// keepsDecoded reports whether the local cache keeps the Guard's values
// decoded (see kept).
func (g *Guard) keepsDecoded() bool {
	b := g.bound.Load()
	return b != nil && (b.shareable || b.copy != nil)
}
