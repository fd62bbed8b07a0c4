package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/clone"
	"github.com/cacheguard/cacheguard/loader"
)

var (
	//go:embed lua/del_if_equal.lua
	delIfEqualLua string
	delIfEqual    = redis.NewScript(delIfEqualLua)
)

// LoadFunc loads the value of id from the source of truth. It reports an ID
// that does not exist with an error wrapping ErrNotFound (for example
// fmt.Errorf("%w: %w", guard.ErrNotFound, sql.ErrNoRows)); any other error
// fails the Get and is not cached.
type LoadFunc[T any] func(ctx context.Context, id string) (T, error)

// Get returns the value of id: from the cache, or from load on a miss (see
// the package doc for the steps). It returns ErrNotFound (test with
// errors.Is) when the ID does not exist, ErrInvalidKey for a malformed ID,
// the load's error wrapped when load fails, ErrBusy, ErrClosed, ErrWrongType
// when g is bound to another type, and errors wrapping ErrUnavailable when
// Redis fails (never ErrNotFound). load runs on a context detached from ctx
// and bounded by LoadTimeout, shared by every caller of id in this process
// whose Get started before the load did; Get itself returns as soon as ctx
// is done.
func Get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	if g == nil || load == nil {
		var zero T
		return zero, errors.New("cacheguard: Get needs a non-nil Guard and load function")
	}
	if g.tel == nil {
		return get(ctx, g, id, load)
	}
	ctx, span := g.tel.start(ctx, "cacheguard.Get")
	v, err := get(ctx, g, id, load)
	g.tel.end(ctx, span, err)
	return v, err
}

// get is Get without its span.
func get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	var zero T
	if err := bind[T](g); err != nil {
		return zero, err
	}
	gone := false // the local copy expired with its Redis entry
	if g.local != nil {
		v, st := localHit[T](ctx, g, id)
		if st == localFresh {
			return v, nil
		}
		gone = st == localGone
	}
	pass, err := g.gate.enter()
	if err != nil {
		return zero, err
	}
	defer g.gate.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		return zero, err
	}
	from := since{at: g.starts.Load()} // a flight that answers this Get must have started after it (join)
	if g.local != nil {
		from.epoch = g.local.epoch.Load() // before the read: see local.put
	}
	// Step 3 in this goroutine: a hit, a reject or a marker is answered
	// from a read made after this Get started, never from another caller's
	// (with Local, from one shared with the ID's other callers if no write
	// was heard since it started: see readShared).
	r, ok := peekedFor(ctx, g, id)
	if !ok && gone && !g.outage.troubled.Load() {
		// The entry has expired in Redis: a read would miss. The lock
		// attempt's re-check reads whatever another process stored since.
		r, ok = readResult{verdict: verdictMiss}, true
	}
	if !ok {
		done, err := g.outage.before()
		if err != nil { // the breaker is open: Redis is not asked (nor counted as failing)
			return loadThrough(ctx, g, id, vkey, load, from, fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err))
		}
		r, err = g.readFor(ctx, id, vkey, from)
		g.outage.after(done, err)
		if downOrRefusing(err) {
			return loadThrough(ctx, g, id, vkey, load, from, err)
		}
		if err != nil {
			return zero, err
		}
	}
	if v, ok, err := answerRead(ctx, g, id, vkey, r, load, from); ok {
		return v, err
	}
	return fill(ctx, g, id, vkey, load, from, r.held)
}

// readFor is step 3 for a caller that started at from: the probe and the
// read (see read), or with Options.Local a read shared with the ID's other
// callers (see readShared).
func (g *Guard) readFor(ctx context.Context, id, vkey string, from since) (readResult, error) {
	if g.local != nil {
		return g.readShared(ctx, id, vkey, from, true)
	}
	return g.read(ctx, id, vkey, true)
}

// answerRead answers a Get from a read: a reject or a marker
// (ErrNotFound) or a value, which it keeps in the local cache and perhaps
// refreshes. ok is false when the read answers nothing (a miss, or a
// corrupt entry, dropped): load.
func answerRead[T any](ctx context.Context, g *Guard, id, vkey string, r readResult, load LoadFunc[T], from since) (v T, ok bool, err error) {
	switch r.verdict {
	case verdictRejected:
		g.answered(ctx, outRejected, false, false)
		return v, true, ErrNotFound
	case verdictEntry:
		if e := decodeEntry[T](ctx, g, vkey, r.raw); e.ok {
			g.answered(ctx, e.found.outcome, false, false)
			if e.err == nil && g.local != nil {
				g.local.put(id, r.raw, kept(g, e.v), r.ttl, from.epoch)
			}
			if e.err == nil && g.opts.RefreshAhead != nil {
				refresh(g, id, vkey, r.raw, load)
			}
			return e.v, true, e.err
		}
	}
	return v, false, nil
}

// localHit answers id from the in-process cache (Options.Local) if it holds
// a copy. It runs outside the close gate's count: it touches no Redis
// connection, and the otter cache stays safe to read while Close empties
// it; once Close has begun, it answers nothing and the caller's gate.enter
// reports ErrClosed. IDs are not checked here: a malformed one was never
// stored, so it misses and Get refuses it afterwards.
func localHit[T any](ctx context.Context, g *Guard, id string) (T, localState) {
	if g.gate.closed.Load() {
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
	g.local.drop(id)
	return zero, localNone
}

// panicked turns a flight's panic into an error wrapping ErrLoaderPanic;
// other errors come back as they are.
func panicked(g *Guard, id string, err error) error {
	if errors.Is(err, loader.ErrPanic) {
		return fmt.Errorf("%w: %s %q: %w", ErrLoaderPanic, g.name, id, err)
	}
	return err
}

// decodeFrame decodes a flight's frame into a caller's own copy.
func decodeFrame[T any](g *Guard, id string, frame []byte) (T, error) {
	var v T
	if err := codec.Decode(g.opts.Codec, frame, &v); err != nil {
		var zero T
		return zero, fmt.Errorf("cacheguard: %s %q: decode: %w", g.name, id, err)
	}
	return v, nil
}

// typeBinding is the type a Guard's values decode into, and how the local
// cache hands out a value it keeps decoded (see kept).
type typeBinding struct {
	t         reflect.Type
	shareable bool // values of t go to several callers as they are: assignment copies everything
	copy      any  // else a func(T) T that deep-copies them (package clone), or nil: decode each time
}

// bind binds g to T on first use and refuses any other T afterwards: two
// types on one Guard would read each other's entries as corrupt and evict
// them. It also settles, once, how the local cache hands out a T it keeps
// decoded (see kept).
func bind[T any](g *Guard) error {
	t := reflect.TypeFor[T]()
	b := g.bound.Load()
	if b == nil {
		nb := &typeBinding{t: t}
		if fn, shareable, ok := clone.For[T](); ok {
			nb.shareable = shareable
			if fn != nil {
				nb.copy = fn
			}
		}
		if g.bound.CompareAndSwap(nil, nb) {
			return nil
		}
	}
	if b = g.bound.Load(); b.t != t {
		return fmt.Errorf("%w: guard %s holds %v values, not %v (one Guard per type; use Options.Version or another name)", ErrWrongType, g.name, b.t, t)
	}
	return nil
}

// kept returns what the local cache keeps of v, a value that a caller
// also gets (or, for Set, that the application still holds): v itself for
// a type whose copies share nothing, a private deep copy of it with the
// copier that makes each caller's own (copied), or nil when the type can
// only be decoded each time.
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

// outcome is how a flight ended, counted once per caller.
type outcome uint8

const (
	outHit outcome = iota + 1
	outEmpty
	outRejected
	outLoaded
	outFailed
	outLocalHit // answered from process memory (Options.Local); never a flight's
)

// flight is what one fill flight hands to all its callers: the frame to
// decode (each caller decodes its own copy, so no two callers share a T),
// and how it ended.
type flight struct {
	frame   []byte
	outcome outcome
	ttl     time.Duration // the TTL it wrote the frame with, or the re-check found it with (0: unknown)
	epoch   uint64        // the local cache's epoch when the flight began
	started uint64        // its number from Guard.starts, taken before the reads it answers from (see since)
	by      any           // the *call[T] whose flight this was
}

// entry is a cache entry judged.
type entry[T any] struct {
	v     T
	found flight
	err   error // ErrNotFound for a marker
	ok    bool  // false: the entry was corrupt (and dropped): load
}

// decodeEntry decodes a cache entry: a value into v, an empty marker into
// ErrNotFound. A corrupt entry (or one this T cannot read) is counted,
// logged and dropped unless a writer has already replaced it, and the caller
// loads; the ID existed, so the filter is not asked again.
func decodeEntry[T any](ctx context.Context, g *Guard, vkey string, raw []byte) entry[T] {
	var e entry[T]
	v := new(T) // the value alone escapes to the codec, not the whole entry
	switch err := codec.Decode(g.opts.Codec, raw, v); {
	case err == nil:
		e.v, e.found, e.ok = *v, flight{frame: raw, outcome: outHit}, true
	case errors.Is(err, codec.ErrEmpty):
		e.found, e.err, e.ok = flight{outcome: outEmpty}, ErrNotFound, true
	default: // no field of the failed decode survives: e.v stays zero
		g.dropCorrupt(ctx, vkey, raw, err)
	}
	return e
}

// jitter returns d spread uniformly over d·(1 ± Jitter), at least 1ms.
func (g *Guard) jitter(d time.Duration) time.Duration {
	if j := g.opts.Jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d, time.Millisecond)
}
