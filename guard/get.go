package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
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
// the load's error wrapped when load fails, ErrBusy, ErrClosed, and errors
// wrapping ErrUnavailable when Redis fails (never ErrNotFound). load runs on a
// context detached from ctx and bounded by LoadTimeout, shared by every caller
// of id in this process; Get itself returns as soon as ctx is done.
func Get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	var zero T
	if g == nil || load == nil {
		return zero, errors.New("cacheguard: Get needs a non-nil Guard and load function")
	}
	if err := g.gate.enter(); err != nil {
		return zero, err
	}
	defer g.gate.leave()
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
	c := &call[T]{g: g, id: id, vkey: vkey, load: load}
	fl, shared, err := g.flights.Do(ctx, vkey, c.fly)
	mine := fl.by == any(c) // this caller's function ran the flight
	g.stats.count(fl.outcome, shared && !mine)
	if errors.Is(err, loader.ErrPanic) {
		err = fmt.Errorf("%w: %s %q: %w", ErrLoaderPanic, g.name, id, err)
	}
	if err != nil {
		return zero, err
	}
	if g.local != nil && mine {
		g.local.put(vkey, fl.frame, fl.epoch)
	}
	if mine && c.decoded {
		return c.v, nil
	}
	var v T
	if err := codec.Decode(g.opts.Codec, fl.frame, &v); err != nil {
		return zero, fmt.Errorf("cacheguard: %s %q: decode: %w", g.name, id, err)
	}
	return v, nil
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

// flight is what one flight hands to all its callers: the frame to decode
// (each caller decodes its own copy, so no two callers share a T), and how it
// ended.
type flight struct {
	frame   []byte
	outcome outcome
	epoch   uint64 // the local cache's epoch when the flight began
	by      any    // the *call[T] whose flight this was
}

// call is the state of one Get, from the flight it may run to its answer.
// Only the flight writes it (fly and the Filler methods, which the
// Coordinator calls from the flight's goroutine), and Get reads it after the
// flight returned, so it needs no lock.
type call[T any] struct {
	g        *Guard
	id, vkey string
	load     LoadFunc[T]

	found   flight // what the read, the re-check or the load found
	err     error  // the answer's error: ErrNotFound after a marker, or the load's failure
	v       T      // the value decoded from found.frame on a hit
	decoded bool   // v holds it
}

// fly is the flight: steps 4 and 5 of the package doc, once for all callers
// of the ID in this process. It passes the gate itself: it can outlive the
// caller that started it.
func (c *call[T]) fly(ctx context.Context) (flight, error) {
	g := c.g
	if err := g.gate.enter(); err != nil {
		return flight{outcome: outFailed}, err
	}
	defer g.gate.leave()
	var epoch uint64
	if g.local != nil {
		epoch = g.local.epoch.Load() // before the read: see local.put
	}
	fl, err := c.readOrFill(ctx)
	fl.epoch, fl.by = epoch, c
	return fl, err
}

// readOrFill reads the ID (or takes what Peek read) and fills it on a miss.
func (c *call[T]) readOrFill(ctx context.Context) (flight, error) {
	g := c.g
	r, ok := peekedFor(ctx, g, c.id)
	if !ok {
		var err error
		if r, err = g.read(ctx, c.id, c.vkey); err != nil {
			return flight{outcome: outFailed}, err
		}
	}
	switch r.verdict {
	case verdictRejected:
		return flight{outcome: outRejected}, ErrNotFound
	case verdictEntry:
		if c.Cached(ctx, r.raw) {
			return c.found, c.err
		}
	}
	return c.fill(ctx)
}

// fill runs a miss through the Coordinator (see loader.Coordinator): one
// load per ID across processes, written with the lock's fence.
func (c *call[T]) fill(ctx context.Context) (flight, error) {
	err := c.g.coord.Run(ctx, c.vkey, c)
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

// Cached judges a cache entry (loader.Filler): a value is decoded into c.v
// (to tell a corrupt entry from a good one), an empty marker answers
// ErrNotFound. A corrupt entry (or one this T cannot read) is dropped unless
// a writer has already replaced it, and the caller loads; the ID existed, so
// the filter is not asked again.
func (c *call[T]) Cached(ctx context.Context, raw []byte) bool {
	var zero T
	c.v = zero // no field of an earlier, failed decode survives
	switch err := codec.Decode(c.g.opts.Codec, raw, &c.v); {
	case err == nil:
		c.found, c.err, c.decoded = flight{frame: raw, outcome: outHit}, nil, true
		return true
	case errors.Is(err, codec.ErrEmpty):
		c.found, c.err = flight{outcome: outEmpty}, ErrNotFound
		return true
	default:
		c.v = zero
		c.g.dropCorrupt(ctx, c.vkey, raw, err)
		return false
	}
}

// Load calls the load function (loader.Filler) under LoadTimeout and returns
// the frame to cache: the value's, or an empty marker when it said
// ErrNotFound.
func (c *call[T]) Load(ctx context.Context) ([]byte, time.Duration, error) {
	g := c.g
	ctx, cancel := context.WithTimeout(ctx, g.opts.LoadTimeout)
	defer cancel()
	g.stats.loads.Add(1)
	c.decoded = false
	val, err := c.load(ctx, c.id)
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

func (g *Guard) dropCorrupt(ctx context.Context, vkey string, raw []byte, why error) {
	g.stats.corrupt.Add(1)
	g.log.WarnContext(ctx, "cacheguard: dropping corrupt cache entry", "key", vkey, "err", why)
	if err := delIfEqual.Run(ctx, g.rdb, []string{vkey}, raw).Err(); err != nil {
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
