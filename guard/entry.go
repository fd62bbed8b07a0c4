package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/clone"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// The cache entry: the field of the ID's hash a value type owns (Version and
// shape: two types or two releases never read each other's bytes), the frame
// a value is written in with its jittered TTL, and how a frame read back
// decodes: a value, a marker (ErrNotFound), or a corrupt entry, dropped and
// loaded again.

// typeBinding is the type a Guard's values decode into, and how the local
// cache hands out a value it keeps decoded (see kept).
type typeBinding struct {
	t         reflect.Type
	field     string // the value hash's field for t (see schemaField)
	fieldArg  any    // field, boxed once for the hit's HGET (see runReads)
	shareable bool   // values of t go to several callers as they are: assignment copies everything
	copy      any    // else a func(T) T that deep-copies them (package clone), or nil: decode each time
}

// bind binds g to T on first use and refuses any other T afterwards: two
// types on one Guard would read each other's entries as corrupt and evict
// them. It also settles, once, how the local cache hands out a T it keeps
// decoded (see kept).
func bind[T any](g *Guard) error {
	t := reflect.TypeFor[T]()
	b := g.bound.Load()
	if b == nil {
		f := schemaField(g.opts.Version, codec.Shape(g.opts.Codec, t))
		nb := &typeBinding{t: t, field: f, fieldArg: f}
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

// schemaField is the hash field of a type's entries: Version, then the
// type's shape (codec.Shape) unless the codec opted out. A type of another
// shape (a field renamed, added, removed, retyped or retagged) reads and
// writes a field of its own, so it never decodes another's bytes into
// zeros, and two releases of a rolling deploy keep their own entries.
func schemaField(version, shape string) string {
	if shape == "" {
		return version
	}
	return version + ":" + shape
}

// field is the bound type's hash field, or "" before the first Get or Set.
func (g *Guard) field() string {
	if b := g.bound.Load(); b != nil {
		return b.field
	}
	return ""
}

// otherSchemas counts a load whose write found entries of other schema
// versions in the ID's hash, and warns once per pair of fields (for the
// first maxSchemaPairs pairs): a deploy that changed the value type, or
// an entry of an earlier cacheguard format, read once as a miss.
func (g *Guard) otherSchemas(key, field string, others []string) {
	if len(others) == 0 {
		return
	}
	g.stats.schemaMisses.Add(1)
	for _, o := range others {
		pair := field + " " + o
		w := &g.schemaWarned
		if _, warned := w.pairs.Load(pair); warned || w.n.Load() >= maxSchemaPairs {
			continue
		}
		if _, warned := w.pairs.LoadOrStore(pair, true); !warned {
			w.n.Add(1)
			g.log.Warn("cacheguard: entry written by another schema (another shape of the value type, another Version, "+
				"or an earlier cacheguard) not read; this type's own was loaded", "key", key, "type", g.bound.Load().t.String(),
				"field", field, "other_field", o)
		}
	}
}

const maxSchemaPairs = 32

// warnedPairs are the pairs of fields otherSchemas has warned of.
type warnedPairs struct {
	pairs sync.Map // "field other" → true
	n     atomic.Int64
}

// valueFrame encodes v for the cache and picks its TTL (with jitter): a
// refresh frame when RefreshAhead is on.
func (g *Guard) valueFrame(v any) ([]byte, time.Duration, error) {
	ttl := g.jitter(g.opts.TTL)
	if g.opts.RefreshAhead {
		frame, err := codec.EncodeRefresh(g.opts.Codec, v, time.Now().Add(time.Duration(float64(ttl)*refreshAt)))
		return frame, ttl, err
	}
	frame, err := codec.Encode(g.opts.Codec, v)
	return frame, ttl, err
}

// jitter returns d spread uniformly over d·(1 ± Jitter), at least 1ms.
func (g *Guard) jitter(d time.Duration) time.Duration {
	if j := g.opts.Jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d, time.Millisecond)
}

// entry is a cache entry judged.
type entry[T any] struct {
	v     T
	found flightResult
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
		e.v, e.found, e.ok = *v, flightResult{frame: raw, outcome: outHit}, true
	case errors.Is(err, codec.ErrEmpty):
		e.found, e.err, e.ok = flightResult{outcome: outEmpty}, ErrNotFound, true
	default: // no field of the failed decode survives: e.v stays zero
		g.dropCorrupt(ctx, vkey, raw, err)
	}
	return e
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

// dropCorrupt counts and logs (at warn level) an entry that does not decode,
// and deletes it if it still holds those bytes.
func (g *Guard) dropCorrupt(ctx context.Context, vkey string, raw []byte, why error) {
	g.stats.corrupt.Add(1)
	g.log.WarnContext(ctx, "cacheguard: dropping a cache entry that does not decode (corrupt, or written by another type or version)",
		"key", vkey, "field", g.field(), "err", why)
	if err := delIfEqual.Run(ctx, g.rdb, []string{vkey}, g.field(), raw).Err(); err != nil {
		_ = g.fail(ctx, "delete corrupt entry", "", redisfail.Wrap(err))
	}
}

var (
	//go:embed lua/del_if_equal.lua
	delIfEqualLua string
	delIfEqual    = redis.NewScript(delIfEqualLua)
)
