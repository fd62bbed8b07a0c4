package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime/debug"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/redisfail"
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
	var zero T
	if g == nil || load == nil {
		return zero, errors.New("cacheguard: Get needs a non-nil Guard and load function")
	}
	if err := g.gate.enter(); err != nil {
		return zero, err
	}
	defer g.gate.leave()
	if err := bind[T](g); err != nil {
		return zero, err
	}
	vkey, err := g.keys.Value(id)
	if err != nil {
		return zero, err
	}
	if g.local != nil {
		if frame, ok := g.local.get(vkey); ok {
			var v T
			if codec.Decode(g.opts.Codec, frame, &v) == nil {
				g.stats.localHits.Add(1)
				return v, nil
			}
			g.local.drop(vkey)
		}
	}
	start := time.Now()
	var epoch uint64
	if g.local != nil {
		epoch = g.local.epoch.Load() // before the read: see local.put
	}
	// Step 3 in this goroutine: a hit, a reject or a marker is answered
	// from a read made after this Get started, never from another caller's.
	r, ok := peekedFor(ctx, g, id)
	if !ok {
		done, err := g.outage.allow()
		if err != nil { // the breaker is open: Redis is not asked (nor counted as failing)
			return loadThrough(ctx, g, id, vkey, load, start, fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err))
		}
		r, err = g.read(ctx, id, vkey)
		done(err)
		if downOrRefusing(err) {
			return loadThrough(ctx, g, id, vkey, load, start, err)
		}
		if err != nil {
			return zero, err
		}
	}
	switch r.verdict {
	case verdictRejected:
		g.stats.count(outRejected, false)
		return zero, ErrNotFound
	case verdictEntry:
		if e := decodeEntry[T](ctx, g, vkey, r.raw); e.ok {
			g.stats.count(e.found.outcome, false)
			if e.err == nil && g.local != nil {
				g.local.put(vkey, r.raw, epoch)
			}
			return e.v, e.err
		}
	}
	return fill(ctx, g, id, vkey, load, start)
}

// fill runs a miss (step 5) through a flight shared with the other callers
// of the ID in this process. A flight's answer serves a caller only if the
// flight started after the caller did: otherwise a write that returned
// between the two could be missing from it. A caller that joined an older
// flight waits for it and then runs (or joins) a new one, which started
// after it: once.
func fill[T any](ctx context.Context, g *Guard, id, vkey string, load LoadFunc[T], start time.Time) (T, error) {
	var zero T
	for attempt := 0; ; attempt++ {
		c := &call[T]{g: g, id: id, vkey: vkey, load: load}
		fl, shared, err := g.flights.Do(ctx, vkey, c.fly)
		mine := fl.by == any(c) // this caller's function ran the flight
		answered := err == nil || errors.Is(err, ErrNotFound)
		if fl.by != nil && answered && fl.started.Before(start) && attempt < 3 {
			continue // joined a flight older than this Get: its answer may predate a write
		}
		if downOrRefusing(err) { // the lock or the re-check failed: Redis cannot fill
			return loadThrough(ctx, g, id, vkey, load, start, err)
		}
		g.stats.count(fl.outcome, shared && !mine)
		if err != nil {
			return zero, panicked(g, id, err)
		}
		if g.local != nil && mine {
			g.local.put(vkey, fl.frame, fl.epoch)
		}
		if mine && c.decoded {
			return c.v, nil
		}
		return decodeFrame[T](g, id, fl.frame)
	}
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

// typeBinding is the type a Guard's values decode into.
type typeBinding struct{ t reflect.Type }

// bind binds g to T on first use and refuses any other T afterwards: two
// types on one Guard would read each other's entries as corrupt and evict
// them.
func bind[T any](g *Guard) error {
	t := reflect.TypeFor[T]()
	b := g.bound.Load()
	if b == nil && g.bound.CompareAndSwap(nil, &typeBinding{t: t}) {
		return nil
	}
	if b = g.bound.Load(); b.t != t {
		return fmt.Errorf("%w: guard %s holds %v values, not %v (one Guard per type; use Options.Version or another name)", ErrWrongType, g.name, b.t, t)
	}
	return nil
}

// outcome is how a flight ended, counted once per caller.
type outcome uint8

const (
	outHit outcome = iota + 1
	outEmpty
	outRejected
	outLoaded
	outFailed
)

// flight is what one fill flight hands to all its callers: the frame to
// decode (each caller decodes its own copy, so no two callers share a T),
// and how it ended.
type flight struct {
	frame   []byte
	outcome outcome
	epoch   uint64    // the local cache's epoch when the flight began
	started time.Time // before any of its reads
	by      any       // the *call[T] whose flight this was
}

// call is the state of one fill flight. Only the flight writes it (fly and
// the Filler methods, which the Coordinator calls from the flight's
// goroutine), and the caller that started it reads it after the flight
// returned, so it needs no lock.
type call[T any] struct {
	g        *Guard
	id, vkey string
	load     LoadFunc[T]

	found   flight // what the re-check or the load found
	err     error  // the answer's error: ErrNotFound after a marker, or the load's failure
	v       T      // the value decoded from found.frame on a hit
	decoded bool   // v holds it
}

// fly is the flight: step 5 of the package doc, once for the callers of the
// ID in this process. It passes the gate itself: it can outlive the caller
// that started it.
func (c *call[T]) fly(ctx context.Context) (flight, error) {
	g := c.g
	if err := g.gate.enter(); err != nil {
		return flight{outcome: outFailed}, err
	}
	defer g.gate.leave()
	started := time.Now()
	var epoch uint64
	if g.local != nil {
		epoch = g.local.epoch.Load() // before the reads: see local.put
	}
	fl, err := c.coordinate(ctx)
	fl.epoch, fl.started, fl.by = epoch, started, c
	return fl, err
}

// coordinate runs the miss through the Coordinator (see loader.Coordinator):
// one load per ID across processes, written with the lock's fence.
func (c *call[T]) coordinate(ctx context.Context) (flight, error) {
	err := c.g.coord.Run(ctx, c.vkey, c.g.field, c)
	switch {
	case err == nil:
		return c.found, c.err // c.err is ErrNotFound after a marker
	case errors.Is(err, loader.ErrBusy):
		return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", c.g.name, c.id, ErrBusy)
	case errors.Is(err, ErrUnavailable):
		return flight{outcome: outFailed}, c.g.fail(ctx, "fill", c.id, err)
	}
	return flight{outcome: outFailed}, err
}

// Cached judges a cache entry (loader.Filler): see decodeEntry.
func (c *call[T]) Cached(ctx context.Context, raw []byte) bool {
	e := decodeEntry[T](ctx, c.g, c.vkey, raw)
	if e.ok {
		c.found, c.err, c.v, c.decoded = e.found, e.err, e.v, e.err == nil
	}
	return e.ok
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
	switch err := codec.Decode(g.opts.Codec, raw, &e.v); {
	case err == nil:
		e.found, e.ok = flight{frame: raw, outcome: outHit}, true
	case errors.Is(err, codec.ErrEmpty):
		e.found, e.err, e.ok = flight{outcome: outEmpty}, ErrNotFound, true
	default:
		var zero T
		e.v = zero // no field of the failed decode survives
		g.dropCorrupt(ctx, vkey, raw, err)
	}
	return e
}

// Load calls the load function (loader.Filler) under LoadTimeout and returns
// the frame to cache: the value's, or an empty marker when it said
// ErrNotFound.
func (c *call[T]) Load(ctx context.Context) ([]byte, time.Duration, error) {
	g := c.g
	g.stats.loads.Add(1)
	c.decoded = false
	val, err := c.bounded(ctx)
	if errors.Is(err, ErrNotFound) {
		c.found, c.err = flight{outcome: outLoaded}, ErrNotFound
		return codec.Empty(), g.jitter(g.opts.EmptyTTL), nil
	}
	if err != nil {
		g.stats.loadErrors.Add(1)
		c.found, c.err = flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: load: %w", g.name, c.id, err)
		return nil, 0, c.err
	}
	frame, err := codec.Encode(g.opts.Codec, val)
	if err != nil {
		g.stats.loadErrors.Add(1)
		c.found, c.err = flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", g.name, c.id, err)
		return nil, 0, c.err
	}
	c.found, c.err = flight{frame: frame, outcome: outLoaded}, nil
	return frame, g.jitter(g.opts.TTL), nil
}

// loaded is what one call of the load function returned (or its panic).
type loaded[T any] struct {
	v     T
	err   error
	panic any
}

// bounded calls the load function and waits for it at most LoadTimeout,
// even if it ignores its ctx: the load runs in a goroutine of its own, and a
// result that comes later is dropped (never cached: nothing waits for it).
// The goroutine ends when the load function returns; a panic in it is
// carried back and raised again here, in the flight, where loader.Group
// turns it into ErrLoaderPanic.
func (c *call[T]) bounded(ctx context.Context) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, c.g.opts.LoadTimeout)
	defer cancel()
	done := make(chan loaded[T], 1)
	go func() {
		var r loaded[T]
		defer func() {
			if p := recover(); p != nil {
				r.panic = fmt.Sprintf("%v\n%s", p, debug.Stack())
			}
			done <- r
		}()
		r.v, r.err = c.load(ctx, c.id)
	}()
	select {
	case r := <-done:
		if r.panic != nil {
			panic(r.panic)
		}
		return r.v, r.err
	case <-ctx.Done():
		c.g.stats.abandonedLoads.Add(1)
		var zero T
		return zero, fmt.Errorf("load did not return within LoadTimeout (%v): %w", c.g.opts.LoadTimeout, ctx.Err())
	}
}

// dropCorrupt counts and logs (at warn level) an entry that does not decode,
// and deletes it if it still holds those bytes.
func (g *Guard) dropCorrupt(ctx context.Context, vkey string, raw []byte, why error) {
	g.stats.corrupt.Add(1)
	g.log.WarnContext(ctx, "cacheguard: dropping a cache entry that does not decode (corrupt, or written by another type or version)",
		"key", vkey, "version", g.field, "err", why)
	if err := delIfEqual.Run(ctx, g.rdb, []string{vkey}, g.field, raw).Err(); err != nil {
		_ = g.fail(ctx, "delete corrupt entry", "", redisfail.Wrap(err))
	}
}

// jitter returns d spread uniformly over d·(1 ± Jitter), at least 1ms.
func (g *Guard) jitter(d time.Duration) time.Duration {
	if j := g.opts.Jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d, time.Millisecond)
}
