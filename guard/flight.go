package guard

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/loader"
	"github.com/cacheguard/cacheguard/lock"
)

// The flight, step 5 of a Get: a miss loads once per ID in this process
// (join) and once across processes, under the key's Redis lock. A flight
// answers only the callers that started before it did (an older one may
// predate a write), after its write landed; each caller decodes its own
// copy. Load-through (Redis cannot answer) runs the load alone.

// fill runs the call's miss (step 5) through a flight shared with the other
// callers of the ID in this process (see join). held is the key's lock if
// the call's read took it (see lockWithRead): the flight the call starts
// loads under it; if the call joins a flight already under way instead,
// it gives the lock back.
func (c *call[T]) fill(ctx context.Context, held *lock.Lock) (T, error) {
	// Between rounds: the flight that ended has written its answer (or
	// another's write deleted it), and a read that starts now usually finds
	// it, one round trip where a flight would take two. The callers in this
	// case share it (they all started before that flight ended), with no
	// lock: the next join attempts it.
	var early struct {
		v   T
		ok  bool
		err error
	}
	reread := func() bool {
		if r, err := c.g.readShared(ctx, c.id, c.vkey, c.from, false); err == nil {
			early.v, early.ok, early.err = c.answer(ctx, r)
		}
		return early.ok
	}
	m := &miss[T]{flight: c.flight(), held: held}
	j, err := c.join(ctx, offer[T]{fl: &m.flight, run: m.run, giveBack: func() { m.giveBack(ctx) }}, reread)
	switch {
	case early.ok:
		return early.v, early.err
	case downOrRefusing(err): // the lock or the re-check failed: Redis cannot fill
		return c.loadThrough(ctx, err)
	}
	return c.answerJoined(ctx, j, err)
}

// flight is a new flight of the call's ID, with its load function.
func (c *call[T]) flight() flight[T] {
	return flight[T]{g: c.g, id: c.id, vkey: c.vkey, load: c.load}
}

// offer is the flight a caller offers to join: it runs, keyed by its kind
// and value key, unless one is under way; giveBack gives up what the caller
// holds that the flight under way may wait for (the lock its read took).
type offer[T any] struct {
	kind     flightKind
	fl       *flight[T]
	run      func(ctx context.Context) (flightResult, error)
	giveBack func()
}

// join runs o's flight in this process, or joins the one under way, for the
// call. A flight's answer serves the call only if the flight (or its load)
// started after the call did: otherwise a write that returned between the
// two could be missing from it (older), and join goes again, four rounds at
// most (o ran only in the last: an older flight is never the caller's own);
// between two rounds reread, if set, may answer instead (it reports whether
// it did). With Options.Local an older flight serves too when the ID's
// local epoch did not move (no write of its stripe made or heard since). Every caller is
// answered when the flight ends, after its write, release and publish ran
// in Redis: a process may exit as soon as its Gets return, and must not
// leave the lock behind.
func (c *call[T]) join(ctx context.Context, o offer[T], reread func() bool) (j joined[T], err error) {
	g := c.g
	serves := func(fl flightResult) bool { // the rule above
		return !c.from.startedBefore(fl.started) || g.noWriteHeard(c.id, fl.epoch)
	}
	key := flightKey{kind: o.kind, vkey: c.vkey}
	for attempt := 0; ; attempt++ {
		j = joined[T]{c: o.fl, through: o.kind == throughFlight}
		j.fl, j.shared, err = g.flights.DoOnJoin(ctx, key, o.run, o.giveBack)
		o.giveBack()                  // or it left before its own flight took the lock
		j.mine = j.fl.by == any(o.fl) // this caller's flight ran
		answered := err == nil || errors.Is(err, ErrNotFound)
		j.older = j.fl.by != nil && answered && !serves(j.fl)
		if !j.older || attempt == 3 || reread != nil && reread() {
			return j, err
		}
	}
}

// joined is a caller's part in a flight: the core of the flight it
// offered, what the flight that answered found, and how the caller stood to it.
type joined[T any] struct {
	c       *flight[T]
	fl      flightResult
	shared  bool // the answer went to more than one caller
	mine    bool // this caller's flight (c) ran
	older   bool // the flight started before the caller: its answer may predate a write
	through bool // a load-through's flight
}

// answerJoined is the call's answer from its flight: counted, a panic made
// ErrLoaderPanic, and its own copy of the value.
func (c *call[T]) answerJoined(ctx context.Context, j joined[T], err error) (T, error) {
	c.g.answered(ctx, j.fl.outcome, j.shared && !j.mine, j.through)
	if err != nil {
		var zero T
		return zero, panicked(c.g, c.id, err)
	}
	return joinedValue(c.g, c.id, j)
}

// joinedValue is a caller's own copy of the value its flight found.
func joinedValue[T any](g *Guard, id string, j joined[T]) (T, error) {
	if j.mine && j.c.decoded {
		return j.c.v, nil // the flight has put its answer in the local cache (keep)
	}
	return decodeFrame[T](g, id, j.fl.frame)
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

// noWriteHeard reports whether the local cache, armed, heard of no write
// of id's stripe since the epoch was then (arming raises the floor, so an
// epoch read before the subscription never passes).
func (g *Guard) noWriteHeard(id string, then uint64) bool {
	return g.local != nil && g.local.sub.Load() != nil && !g.local.changed(g.local.stripe(id), then)
}

// flightKey keys the Guard's flights (Guard.flights): the fills of a value
// key, its load-throughs and its refresh ahead of expiry are flights apart.
type flightKey struct {
	kind flightKind
	vkey string
}

// flightGroup runs the Guard's flights, one per flightKey at a time.
type flightGroup = loader.Group[flightKey, flightResult]

// flightKind tells the flights of one value key apart.
type flightKind uint8

const (
	fillFlight    flightKind = iota // fill: the miss, through the Coordinator
	throughFlight                   // loadThrough: the load alone, without Redis
	refreshFlight                   // refresh: ahead of expiry, nobody waits
)

// flightResult is what one flight hands to all its callers: the frame to
// decode (each caller decodes its own copy, so no two callers share a T),
// and how it ended.
type flightResult struct {
	frame   []byte
	outcome outcome
	life    lifetime // the TTL it wrote the frame with, or the re-check found it with
	epoch   uint64   // the local cache's epoch when the flight began
	started uint64   // its number from Guard.starts, taken before the reads it answers from (see since)
	by      any      // the *flight[T] that ran
}

// flight is the core every role of a flight shares (a miss, a
// load-through, a refresh): the ID it loads, and what its re-check or load
// found. Only the flight writes it (its run and the calls the Coordinator
// makes from the flight's goroutine); the caller that offered it reads it
// after the flight returned: it needs no lock.
type flight[T any] struct {
	g        *Guard
	id, vkey string
	load     LoadFunc[T]
	loadedAt uint64       // the last load's number from Guard.starts, taken as it began (0: no load)
	found    flightResult // what the re-check or the load found
	err      error        // the answer's error: ErrNotFound after a marker, or the load's failure
	v        T            // the value decoded from found.frame: on a hit, or by keep when the local cache keeps values decoded
	decoded  bool         // v holds it
}

// miss is the flight of a miss, a Get's or a GetMany member's: through the
// Coordinator, under the lock the caller's read took if any, and kept in
// the local cache.
type miss[T any] struct {
	flight[T]
	member    *member[T]   // the GetMany member it loads for (nil: a Get's): its batch loads and records the load
	held      *lock.Lock   // the key's lock, taken by the caller's read (see lockWithRead), or nil
	heldClaim atomic.Int32 // who uses held, the first to claim it (claimHeld)
	epoch     uint64       // the local cache's epoch when the flight began (0 without Options.Local)
	began     time.Time    // with Options.Local: a clock read before the lock attempt and its re-check (see local.put)
	kept      bool         // the current load's answer is in the local cache (keep)
}

// run is the flight: step 5 of the package doc, once for the callers of the
// ID in this process. It runs in its caller's goroutine or in one of the
// supervisor's (loader.Group.Spawn), so Close waits for it even when
// it outlives the caller that started it.
func (c *miss[T]) run(ctx context.Context) (flightResult, error) {
	g := c.g
	started := g.starts.Add(1)
	if g.local != nil {
		c.epoch = g.local.epoch.Load() // before the reads: see local.put
	}
	fl, err := c.coordinate(ctx)
	if c.loadedAt != 0 {
		// The answer was read from the source of truth after this number
		// was taken: it serves every caller that started before (see join).
		started = c.loadedAt
	}
	fl.epoch, fl.started, fl.by = c.epoch, started, &c.flight
	if g.local != nil && err == nil && !c.kept {
		c.keep(fl)
	}
	return fl, err
}

// keep puts what the flight loaded in the local cache while the flight is
// still the ID's, after its write. A caller
// that arrives before the end of the flight joins it (see join) instead of
// finding the expired copy (see goneGrace) and starting a flight of its
// own, a lock attempt and a release. A type that can be handed out without
// a decode is kept decoded (see kept). An entry the lock attempt's re-check
// found is kept too, for the TTL the re-check read with it (see accept);
// a marker is not (as on the read path).
func (c *miss[T]) keep(fl flightResult) {
	g := c.g
	if fl.life.ttl <= 0 {
		return
	}
	var value any
	if g.keepsDecoded() {
		if !c.decoded { // decoded once: the caller that started the flight takes it too (fill)
			var v T
			if codec.Decode(g.opts.Codec, fl.frame, &v) != nil {
				return
			}
			c.v, c.decoded = v, true
		}
		value = kept(g, c.v) // c.v goes to the caller that started the flight
	}
	g.local.put(c.id, fl.frame, value, fl.life, fl.epoch)
	c.kept = true
}

// Claims on miss.held: the caller's read took the key's lock, and either
// the flight the caller started loads under it, or the caller gives it back
// once join returns (it joined another flight, or left before its own
// began). Whichever claims it first.
const (
	heldByFlight = 1 + iota
	heldByCaller
)

// claimHeld claims c.held for who, and reports whether who got it.
func (c *miss[T]) claimHeld(who int32) bool {
	return c.held != nil && c.heldClaim.CompareAndSwap(0, who)
}

// giveBack is the miss's part when its caller joins a flight under way, or
// leaves join: that flight may wait for the lock the caller's read took,
// so it goes back unless this flight took it; and a GetMany member that
// does not load is decided (its batch need not wait for it).
func (c *miss[T]) giveBack(ctx context.Context) {
	if c.claimHeld(heldByCaller) {
		c.g.giveBack(ctx, c.held, c.vkey)
	}
	if c.member != nil {
		c.member.decide()
	}
}

// coordinate runs the miss through the Coordinator (see loader.Coordinator):
// one load per ID across processes, written only while its lock is its own.
// Under the lock the caller's read took, it starts at the load.
func (c *miss[T]) coordinate(ctx context.Context) (flightResult, error) {
	if c.g.local != nil {
		c.began = time.Now()
	}
	f := loader.Fill{Accept: c.accept, Load: c.Load}
	if c.member != nil {
		f.Waiting = c.member.decide // it waits for another holder: its load will not be the batch's now
	}
	var held *lock.Lock
	if c.claimHeld(heldByFlight) {
		held = c.held
	}
	ran, err := c.g.coord.Run(ctx, c.vkey, c.g.field(), held, f)
	c.g.ran(ctx, c.vkey, ran)
	switch {
	case err == nil:
		return c.found, c.err // c.err is ErrNotFound after a marker
	case errors.Is(err, loader.ErrBusy):
		return flightResult{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", c.g.name, c.id, ErrBusy)
	case errors.Is(err, ErrUnavailable):
		return flightResult{outcome: outFailed}, c.g.fail(ctx, "fill", c.id, err)
	default:
		return flightResult{outcome: outFailed}, err
	}
}

// ran records what a Run or TryRun of vkey met besides its answer: each
// wait (telemetry), a write Redis failed (the load is served, not cached)
// and entries of other schema versions.
func (g *Guard) ran(ctx context.Context, vkey string, r loader.Ran) {
	for _, w := range r.Waits {
		g.tel.waited(ctx, w.Began, w.Ended, w.Result) // a nil telemetry records nothing
	}
	if r.WriteErr != nil {
		_ = g.fail(g.sup.ctx, "write", g.idOf(vkey), r.WriteErr)
	}
	if len(r.Others) > 0 {
		g.otherSchemas(vkey, g.field(), r.Others)
	}
}

// accept judges an entry the Coordinator read (loader.Fill.Accept): see
// decodeEntry. One the lock attempt's re-check read with its TTL
// (Options.Local) the flight keeps for that long at most (see keep):
// without it, a copy that expired in memory before its entry did in Redis
// sent every Get of the key to a flight of its own until the entry expired
// there too (docs/design.md, Local cache).
func (c *miss[T]) accept(ctx context.Context, raw []byte, ttl time.Duration) bool {
	if !c.decode(ctx, raw) {
		return false
	}
	if ttl > 0 && c.err == nil {
		c.found.life = lifetime{ttl: ttl, sent: c.began}
	}
	return true
}

// Load is the miss's load (loader.Fill.Load). A GetMany member's is its
// batch's, which records its one call (batchLoad.run).
func (c *miss[T]) Load(ctx context.Context) ([]byte, time.Duration, error) {
	c.kept = false
	return c.loadFrame(ctx, c.member == nil)
}

// decode judges a cache entry: see decodeEntry.
func (c *flight[T]) decode(ctx context.Context, raw []byte) bool {
	e := decodeEntry[T](ctx, c.g, c.vkey, raw)
	if e.ok {
		c.found, c.err, c.v, c.decoded = e.found, e.err, e.v, e.err == nil
	}
	return e.ok
}

// Load is loadFrame, recorded by the telemetry (loader.Fill.Load).
func (c *flight[T]) Load(ctx context.Context) ([]byte, time.Duration, error) {
	return c.loadFrame(ctx, true)
}

// loadFrame calls the load function under LoadTimeout (traced: in a span of
// its own) and returns the frame to cache: the value's, or an empty marker
// when it said ErrNotFound.
func (c *flight[T]) loadFrame(ctx context.Context, traced bool) (_ []byte, _ time.Duration, err error) {
	g := c.g
	defer func() {
		if p := recover(); p != nil { // a panicking load is a failed one: counted so, then raised again
			g.loaded(1, ErrLoaderPanic)
			panic(p)
		}
		g.loaded(1, err)
	}()
	c.decoded = false
	c.loadedAt = g.starts.Add(1) // before the load reads: see join
	done := func(error) {}
	if traced && g.tel != nil {
		ctx, done = g.tel.load(ctx)
	}
	val, err := c.bounded(ctx)
	done(err)
	if errors.Is(err, ErrNotFound) {
		c.found, c.err = flightResult{outcome: outLoaded}, ErrNotFound
		return codec.Empty(), g.jitter(g.opts.EmptyTTL), nil
	}
	if err != nil {
		c.found, c.err = flightResult{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: load: %w", g.name, c.id, err)
		return nil, 0, c.err
	}
	frame, ttl, err := g.valueFrame(val)
	if err != nil {
		c.found, c.err = flightResult{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", g.name, c.id, err)
		return nil, 0, c.err
	}
	c.found, c.err = flightResult{frame: frame, outcome: outLoaded, life: lifetime{ttl: ttl}}, nil
	if g.local != nil {
		c.found.life.sent = time.Now() // before the write: its TTL counts from later (see local.put)
	}
	return frame, ttl, nil
}

// loadPanic is a load's panic, raised again in the flight with the stack of
// the load's goroutine, which loader.Group reports instead of its own.
type loadPanic struct {
	value any
	stack []byte
}

func (p loadPanic) String() string     { return fmt.Sprint(p.value) }
func (p loadPanic) PanicStack() []byte { return p.stack }

// loaded is what one call of the load function returned (or its panic).
type loaded[T any] struct {
	v     T
	err   error
	panic any
}

// bounded calls the load function and waits for it at most LoadTimeout,
// even if it ignores its ctx: the load runs in a goroutine of its own, and a
// result that comes later is dropped (never cached: nothing waits for it).
// The goroutine is the supervisor's (Close waits for it) and ends when the
// load function returns; a panic in it is carried back and raised again
// here, in the flight, where loader.Group turns it into ErrLoaderPanic.
func (c *flight[T]) bounded(ctx context.Context) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, c.g.opts.LoadTimeout)
	defer cancel()
	done := make(chan loaded[T], 1)
	if !c.g.sup.goRun(func(context.Context) {
		var r loaded[T]
		defer func() {
			if p := recover(); p != nil {
				r.panic = loadPanic{value: p, stack: debug.Stack()}
			}
			done <- r
		}()
		r.v, r.err = c.load(ctx, c.id)
	}) {
		var zero T
		return zero, ErrClosed
	}
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

// loadThrough answers the call from the load function alone, without
// Redis: the outage policy. cause is why (Redis cannot answer, or the ID's
// write has not landed). Loads are merged per ID in this process (a flight
// keyed apart from the fill flights) under the same started-after rule as
// fill (join), and capped by MaxLoads.
func (c *call[T]) loadThrough(ctx context.Context, cause error) (T, error) {
	if c.g.outage.failFast || ctx.Err() != nil { // a caller whose ctx ended (its read timed out) gets nothing from a load
		var zero T
		return zero, cause
	}
	fl := c.flight()
	j, err := c.join(ctx, offer[T]{kind: throughFlight, fl: &fl, run: fl.through, giveBack: func() {}}, nil)
	return c.answerJoined(ctx, j, err)
}

// through is the flight of a load-through: one load, no Redis.
func (c *flight[T]) through(ctx context.Context) (flightResult, error) {
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
