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

// Get, the five steps of the package doc, top-down in get: memory answers
// first (Local), then one read (read.go) answers a value, a reject or a
// marker; a miss joins its flight (flight.go); an ID whose write Redis has
// not taken, or a Redis that cannot answer, loads through. Then the cache
// entry a Get reads and its flight writes.

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
		return zero, errNil("Get")
	}
	if g.tel != nil { // one call deep either way
		return getTraced(ctx, g, id, load)
	}
	return get(ctx, g, id, load)
}

// getTraced is get inside the Get's span.
func getTraced[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	ctx, span := g.tel.start(ctx, "cacheguard.Get")
	v, err := get(ctx, g, id, load)
	g.tel.end(ctx, span, err)
	return v, err
}

// call is one Get, built once by get: the Guard, the ID, its value key, the
// load function, and when the Get started (see since). The steps of a miss
// are its methods: read, answer, fill (flight.go) or loadThrough.
type call[T any] struct {
	g    *Guard
	id   string
	vkey string
	load LoadFunc[T]
	from since
}

// get is the five steps of a Get, top-down (g and load are not nil: Get
// checked them): memory, then one read, then the read's answer, a fill or a
// load-through.
func get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	var zero T
	if err := bind[T](g); err != nil {
		return zero, err
	}
	gone := false // the local copy expired with its Redis entry
	// Not for an ID whose write Redis has not taken: a read made after a
	// failover, before the Guard knew of it, may have kept the entry a lost
	// write had replaced (read sends it to load through).
	if g.local != nil && !g.unw.has(id) {
		v, st := localHit[T](ctx, g, id)
		if st == localFresh {
			return v, nil
		}
		gone = st == localGone
	}
	pass, err := g.sup.enter()
	if err != nil {
		return zero, err
	}
	defer g.sup.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		return zero, err
	}
	c := &call[T]{g: g, id: id, vkey: vkey, load: load, from: since{at: g.starts.Load()}}
	if g.local != nil {
		c.from.epoch = g.local.epoch.Load() // before the read: see local.put
	}
	r, err := c.read(ctx, gone)
	switch {
	case err != nil: // answered without a load
		return zero, err
	case r.through != nil:
		return c.loadThrough(ctx, r.through)
	}
	if v, ok, err := c.answer(ctx, r); ok {
		return v, err
	}
	return c.fill(ctx, r.held)
}

// read is step 3 for the call: a hit, a reject or a marker is read after
// the Get started, never taken from another caller's read (with Local, one
// shared with the ID's other callers if no write was heard since it
// started: see readShared); Peek's read on ctx counts as the Get's, and a
// local copy that expired with its entry (gone) skips to the miss, whose
// lock attempt re-checks. r.through says why the Get must load through
// instead: Redis cannot answer, or the ID's write has not landed. err is an
// answer without a load: a reject Peek counted, ErrUnconfirmed from the
// filter's copy, or a failure.
func (c *call[T]) read(ctx context.Context, gone bool) (r readResult, err error) {
	g := c.g
	if g.unw.has(c.id) { // its write has not reached Redis yet: the entry may be the one it replaces
		return readResult{through: c.unwritten()}, nil
	}
	replays := g.unw.replayed.Load() // a replay landing during the read: see below
	switch p := peekedFor(ctx, g, c.id); {
	case p != nil && p.answered: // counted by Peek
		return r, ErrNotFound
	case p != nil && p.failed != nil: // Peek found Redis unable to answer (it asked the copy): do not wait for it twice
		return readResult{through: p.failed}, nil
	case p != nil:
		r, replays = p.r, p.replays // the replays that landed since Peek's read count too
		c.from.epoch = p.epoch      // and the writes heard since it (see local.put)
	case gone && !g.outage.troubled.Load():
		r = readResult{verdict: verdictMiss}
	default:
		done, err := g.outage.before()
		if err != nil { // the breaker is open: Redis is not asked (nor counted as failing)
			err = fmt.Errorf("cacheguard: %s %q: read: %w", g.name, c.id, err)
		} else {
			r, err = g.readFor(ctx, c.id, c.vkey, c.from)
			g.outage.after(done, err)
		}
		if downOrRefusing(err) {
			return readResult{through: err}, g.absentInCopy(ctx, c.id, err)
		}
		if err != nil {
			return r, err
		}
	}
	// The read's check found the ID's write lost by Redis (lost.go), or a
	// replay landed while it read: the entry may be the one a write replaced.
	if g.unw.has(c.id) || g.unw.replayed.Load() != replays {
		g.giveBack(ctx, r.held, c.vkey)
		return readResult{through: c.unwritten()}, nil
	}
	return r, nil
}

// unwritten is why a Get of an ID whose last write did not reach Redis
// loads through, as in an outage, until the write is replayed (replay.go).
func (c *call[T]) unwritten() error {
	return fmt.Errorf("cacheguard: %s %q: %w", c.g.name, c.id, errUnwritten)
}

// peekedFor is the read a Peek left in ctx for this Get, if any (nil: none).
func peekedFor(ctx context.Context, g *Guard, id string) *peeked {
	p, ok := ctx.Value(peekKey{}).(*peeked)
	if !ok || p.g != g || p.id != id || p.used.Swap(true) {
		return nil
	}
	return p
}

// since is when a caller started: Guard.starts then, and the local cache's
// epoch then (0 without Options.Local). A flight or shared read takes its
// number with starts.Add(1) as it starts, so it started after the caller
// exactly when its number is greater than the caller's at: the atomic
// orders the two, with no clock to read on every Get and no two starts on
// the same tick.
type since struct {
	at    uint64
	epoch uint64
}

// startedBefore reports whether a flight or shared read numbered n started
// before the caller at from (see since).
func (from since) startedBefore(n uint64) bool { return n <= from.at }

// readFor is step 3 for a caller that started at from: the probe and the
// read (see read), or with Options.Local a read shared with the ID's other
// callers (see readShared).
func (g *Guard) readFor(ctx context.Context, id, vkey string, from since) (readResult, error) {
	if g.local != nil {
		return g.readShared(ctx, id, vkey, from, true)
	}
	return g.read(ctx, id, vkey, true)
}

// answer answers the call from its read: a reject or a marker
// (ErrNotFound) or a value, which it keeps in the local cache and perhaps
// refreshes. ok is false when the read answers nothing (a miss, or a
// corrupt entry, dropped): load.
func (c *call[T]) answer(ctx context.Context, r readResult) (v T, ok bool, err error) {
	g := c.g
	switch r.verdict {
	case verdictRejected:
		g.answered(ctx, outRejected, false, false)
		return v, true, ErrNotFound
	case verdictUnconfirmed:
		return v, true, g.unconfirmed(ctx, c.id, nil)
	case verdictEntry:
		if e := decodeEntry[T](ctx, g, c.vkey, r.raw); e.ok {
			g.answered(ctx, e.found.outcome, false, false)
			if e.err == nil && g.local != nil {
				g.local.put(c.id, r.raw, kept(g, e.v), r.life, c.from.epoch)
			}
			if e.err == nil && g.opts.RefreshAhead {
				refresh(g, c.id, c.vkey, r.raw, c.load)
			}
			return e.v, true, e.err
		}
	}
	return v, false, nil
}

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
				"or an earlier cacheguard) not read; this type's own was loaded", "id", g.idOf(key), "key", key, "type", g.bound.Load().t.String(),
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

// jitter returns d spread uniformly over d·(1 ± Jitter), in whole
// milliseconds, at least 1: the TTL Redis is sent. A local copy counts the
// same TTL; a fraction of a millisecond Redis never kept would let the copy
// outlive its entry.
func (g *Guard) jitter(d time.Duration) time.Duration {
	if j := g.opts.Jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d.Truncate(time.Millisecond), time.Millisecond)
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

// dropCorrupt counts and logs (at warn level) an entry that does not decode,
// and deletes it if it still holds those bytes.
func (g *Guard) dropCorrupt(ctx context.Context, vkey string, raw []byte, why error) {
	g.stats.corrupt.Add(1)
	g.log.WarnContext(ctx, "cacheguard: dropping a cache entry that does not decode (corrupt, or written by another type or version)",
		"id", g.idOf(vkey), "key", vkey, "field", g.field(), "err", why)
	if err := delIfEqual.Run(ctx, g.rdb, []string{vkey}, g.field(), raw).Err(); err != nil {
		_ = g.fail(ctx, "delete corrupt entry", g.idOf(vkey), redisfail.Wrap(err))
	}
}

var (
	//go:embed lua/del_if_equal.lua
	delIfEqualLua string
	delIfEqual    = redis.NewScript(delIfEqualLua)
)

// How a Get is answered is counted: by outcome, in Stats (and, with
// OpenTelemetry, on its counter and span).

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

// counters is the live form of Stats; every field is updated atomically.
// The outcomes every hit or reject counts are striped (see stripes); the
// rest are rare.
type counters struct {
	hits, empty, rejects, localHits                   stripes
	misses, coalesced                                 atomic.Uint64
	loads, loadErrors, redisErrors, corrupt, bypasses atomic.Uint64
	loadThroughs, shed, breakerOpens, abandonedLoads  atomic.Uint64
	refreshes, schemaMisses, writesLost, unconfirmed  atomic.Uint64
}

func (c *counters) count(o outcome, coalesced bool) {
	switch o {
	case outHit:
		c.hits.inc()
	case outEmpty:
		c.empty.inc()
	case outRejected:
		c.rejects.inc()
	case outLoaded:
		c.misses.Add(1)
	case outLocalHit:
		c.localHits.inc()
	}
	if coalesced {
		c.coalesced.Add(1)
	}
}

// answered counts how one Get was answered, in Stats and, with
// OpenTelemetry on, on the gets counter and the Get's span: every count of
// an answer goes through here (or answeredMany). coalesced: from another
// caller's flight; through: loaded without Redis (the outage policy).
func (g *Guard) answered(ctx context.Context, o outcome, coalesced, through bool) {
	g.stats.count(o, coalesced)
	if g.tel != nil {
		g.tel.settled(ctx, o, coalesced, through, false)
	}
}

// answeredMany is answered for one ID of a GetMany: its span is the
// GetMany's, which gets no per-ID outcome.
func (g *Guard) answeredMany(ctx context.Context, o outcome, coalesced, through bool) {
	g.stats.count(o, coalesced)
	if g.tel != nil {
		g.tel.settled(ctx, o, false, through, true)
	}
}

// loaded counts n IDs asked of a load function, and their failure if err
// is one (ErrNotFound is an answer, not a failure): every load of every
// entry point is counted here.
func (g *Guard) loaded(n int, err error) {
	g.stats.loads.Add(uint64(n))
	if err != nil && !errors.Is(err, ErrNotFound) {
		g.stats.loadErrors.Add(uint64(n))
	}
}
