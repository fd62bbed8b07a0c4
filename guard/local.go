package guard

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/pubsub"
)

// LocalOptions turns on an in-process cache in front of Redis: values this
// process read or loaded are served from memory, with no round trip, for up
// to TTL, and never past their entry's TTL in Redis. This process's writes
// drop or replace its copy before they return; other processes drop theirs
// when the write's pub/sub message arrives (milliseconds; TTL bounds a lost
// one): without Local the guarantee is exact. Copies are kept decoded where
// the type allows, each caller getting its own (docs/design-notes.md).
type LocalOptions struct {
	// Size caps the values kept; when full, otter's adaptive W-TinyLFU picks
	// what goes (it keeps what is read often and recently). Default 10,000.
	Size int
	// TTL is how long a value is served from memory at most: a copy also
	// never outlives its entry's TTL in Redis. Default 1 second.
	TTL time.Duration
}

// local is the in-process cache: otter holds the copies, keyed by ID (a
// local hit builds no value key); the invalidation subscription and the
// epoch keep them right.
type local struct {
	c    *otter.Cache[string, localEntry]
	ttl  time.Duration
	idOf func(vkey string) (string, bool) // the ID an invalidation message (a value key) names
	// epoch rises with every invalidation this process hears of or makes; a
	// copy read from Redis before an invalidation must not be kept after it.
	epoch atomic.Uint64

	// sub delivers invalidation messages (its goroutine calls invalidated).
	// Until it is set the cache is unarmed: get misses and put keeps
	// nothing, since no invalidation could reach a copy.
	sub   atomic.Pointer[pubsub.Subscription]
	armMu sync.Mutex // serializes arm and close
}

// localEntry is one copy: its frame, the decoded value when the type
// allows handing it out without a decode (see kept), and how long it may
// live.
type localEntry struct {
	frame []byte
	value any // a T (shareable types), a copied[T] (types copied per caller), or nil: decode
	life  time.Duration
	// gone: the copy dies with its entry in Redis, at until (Unix nanoseconds);
	// otter keeps it goneGrace longer, so that a Get that finds it past until
	// knows Redis has nothing to read either. Only such copies cost a hit a
	// clock read.
	gone  bool
	until int64
}

// goneGrace is how long a copy that lived as long as its Redis entry is
// remembered after both expired: a Get then skips the read, which would
// miss, and goes straight to the lock attempt. Short, because a copy kept
// while another process reloaded the entry costs a lock where a read hits.
const goneGrace = 100 * time.Millisecond

// newLocal returns an unarmed local cache; arm subscribes it. idOf maps the
// value keys of invalidation messages to IDs.
func newLocal(o LocalOptions, idOf func(vkey string) (string, bool)) (*local, error) {
	o.Size = cmp.Or(o.Size, 10_000)
	o.TTL = cmp.Or(o.TTL, time.Second)
	if o.Size < 0 || o.TTL < 0 {
		return nil, fmt.Errorf("%w: Local %+v", ErrInvalidOptions, o)
	}
	c, err := otter.New(&otter.Options[string, localEntry]{
		MaximumSize: o.Size,
		ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, localEntry]) time.Duration {
			if e.Value.gone {
				return e.Value.life + goneGrace
			}
			return e.Value.life
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: Local: %w", ErrInvalidOptions, err)
	}
	return &local{c: c, ttl: o.TTL, idOf: idOf}, nil
}

// arm subscribes to the invalidation channel (once; again after a failure),
// so the cache starts keeping copies.
func (l *local) arm(ctx context.Context, rdb redis.UniversalClient, channel string) error {
	l.armMu.Lock()
	defer l.armMu.Unlock()
	if l.sub.Load() != nil {
		return nil
	}
	sub, err := pubsub.Subscribe(ctx, rdb, channel, l.invalidated)
	if err != nil {
		return err
	}
	l.epoch.Add(1) // copies read before the subscription cannot be kept
	l.sub.Store(sub)
	return nil
}

// invalidated applies an invalidation message (a value key). A message
// that names no value key of this Guard drops nothing, but still raises the
// epoch.
func (l *local) invalidated(vkey string) {
	l.epoch.Add(1)
	if id, ok := l.idOf(vkey); ok {
		l.c.Invalidate(id)
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
// decodes (one that does not is dropped).
func fromLocal[T any](g *Guard, id string) (T, localState) {
	var zero T
	e, st := g.local.get(id)
	if st != localFresh {
		return zero, st
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

func (l *local) get(id string) (localEntry, localState) {
	if l.sub.Load() == nil {
		return localEntry{}, localNone
	}
	e, ok := l.c.GetIfPresent(id)
	switch {
	case !ok:
		return localEntry{}, localNone
	case e.gone && time.Now().UnixNano() >= e.until:
		return localEntry{}, localGone
	}
	return e, localFresh
}

// put keeps a copy for min(TTL, what is left of redisTTL), unless an
// invalidation arrived since epoch was read (before the read that found
// frame). redisTTL is counted from since, a clock read before the round
// trip that wrote or read it: Redis counts it from later, so the copy never
// outlives its entry. otter takes no lock that the invalidation also takes,
// so put checks the epoch again after storing and takes the copy back if an
// invalidation came in between: an invalidation that raised the epoch before
// that check is seen there, and one that raised it after removes the copy.
func (l *local) put(id string, frame []byte, value any, redisTTL time.Duration, since time.Time, epoch uint64) {
	now := time.Now() // one reading: the copy ends by since + redisTTL
	if redisTTL > 0 {
		redisTTL -= now.Sub(since)
	}
	if l.sub.Load() == nil || redisTTL <= 0 || l.epoch.Load() != epoch {
		return
	}
	life := min(l.ttl, redisTTL)
	// A frame with a refresh-at time (RefreshAhead) is kept only until then
	// (past it, not at all): the Get after it reads Redis and starts the
	// refresh, so a hot key served from memory does not expire under its readers.
	gone := redisTTL <= l.ttl // it dies with its entry (unless refresh-at comes first)
	if at, ok := codec.RefreshAt(frame); ok {
		if until := at.Sub(now); until < life {
			life, gone = until, false
		}
	}
	if life <= 0 {
		return
	}
	e := localEntry{frame: frame, value: value, life: life, gone: gone}
	if gone {
		e.until = now.Add(life).UnixNano()
	}
	l.c.Set(id, e)
	if l.epoch.Load() != epoch {
		l.c.Invalidate(id)
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
