package guard

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/coord"
	"github.com/cacheguard/cacheguard/internal/flightgroup"
	"github.com/cacheguard/cacheguard/lock"
)

// The flight, step 5 of a Get: a miss loads once per ID in this process
// (join) and once across processes, under the key's Redis lock. A flight
// answers only the callers that started before it did (an older one may
// predate a write), after its write landed; each caller decodes its own
// copy. Load-through (Redis cannot answer) runs the load alone.

// joined is a caller's part in a flight: the call that ran it, what it
// found, and how the caller stood to it.
type joined[T any] struct {
	c      *flight[T]
	fl     flightResult
	shared bool // the answer went to more than one caller
	mine   bool // this caller's function ran the flight
	older  bool // the flight started before the caller: its answer may predate a write
}

// join runs the flight key in this process, or joins the one under way, for
// a caller that started at from. A flight's answer serves a caller only if
// the flight (or its load) started after the caller did: otherwise a write
// that returned between the two could be missing from it (older). With
// Options.Local an older flight serves too when the local epoch did not move
// (no write made or heard since). Every caller is answered when the flight
// ends, after its write, release and publish ran in Redis: a process may
// exit as soon as its Gets return, and must not leave the lock behind.
func join[T any](ctx context.Context, g *Guard, key flightKey, from since, proto flight[T],
	run func(c *flight[T], ctx context.Context) (flightResult, error),
) (joined[T], error) {
	serves := func(fl flightResult) bool { // the rule above
		return !from.startedBefore(fl.started) || g.noWriteHeard(fl.epoch, from.epoch)
	}
	j := joined[T]{c: &flight[T]{g: proto.g, id: proto.id, vkey: proto.vkey, load: proto.load, held: proto.held, waiter: proto.waiter}}
	c := j.c
	giveBack := func() { // a flight under way may wait for the lock this caller's read took
		if c.claimHeld(heldByCaller) {
			g.giveBack(c.held, c.vkey)
		}
		c.Waiting() // a GetMany member that joins another flight does not load: its batch need not wait for it
	}
	onJoin := giveBack
	if hook := g.joinedHook.Load(); hook != nil {
		onJoin = func() { giveBack(); (*hook)(key.vkey, false) }
	}
	var err error
	j.fl, j.shared, err = g.flights.DoOnJoin(ctx, key, func(ctx context.Context) (flightResult, error) {
		return run(c, ctx)
	}, onJoin)
	giveBack()                 // or it left before its own flight took the lock
	j.mine = j.fl.by == any(c) // this caller's function ran the flight
	answered := err == nil || errors.Is(err, ErrNotFound)
	j.older = j.fl.by != nil && answered && !serves(j.fl)
	return j, err
}

// flightKey keys the Guard's flights (Guard.flights): the fills of a value
// key, its load-throughs and its refresh ahead of expiry are flights apart.
type flightKey struct {
	kind flightKind
	vkey string
}

// flightGroup runs the Guard's flights, one per flightKey at a time.
type flightGroup = flightgroup.Group[flightKey, flightResult]

// flightKind tells the flights of one value key apart.
type flightKind uint8

const (
	fillFlight    flightKind = iota // fill: the miss, through the Coordinator
	throughFlight                   // loadThrough: the load alone, without Redis
	refreshFlight                   // refresh: ahead of expiry, nobody waits
)

// joinServed joins flights of key until one serves the caller (join), four
// times at most: the one retry loop of fill and loadThrough. Between two
// rounds reread, if set, may answer instead (it reports whether it did).
func joinServed[T any](ctx context.Context, g *Guard, key flightKey, from since, proto flight[T],
	run func(c *flight[T], ctx context.Context) (flightResult, error), reread func() bool,
) (j joined[T], err error) {
	for attempt := 0; ; attempt++ {
		j, err = join(ctx, g, key, from, proto, run)
		proto.held = nil // join gave it to the flight or back; a later round attempts as usual
		if !j.older || attempt == 3 || reread != nil && reread() {
			return j, err
		}
	}
}

// answerJoined is a caller's answer from its flight: counted, a panic made
// ErrLoaderPanic, and its own copy of the value. through: a load-through.
func answerJoined[T any](ctx context.Context, g *Guard, id string, j joined[T], err error, through bool) (T, error) {
	g.answered(ctx, j.fl.outcome, j.shared && !j.mine, through)
	if err != nil {
		var zero T
		return zero, panicked(g, id, err)
	}
	return joinedValue(g, id, j)
}

// joinedValue is a caller's own copy of the value its flight found.
func joinedValue[T any](g *Guard, id string, j joined[T]) (T, error) {
	if j.mine && j.c.decoded {
		return j.c.v, nil // the flight has put its answer in the local cache (keep)
	}
	return decodeFrame[T](g, id, j.fl.frame)
}

// noWriteHeard reports whether the local cache heard of no write between
// two epochs read while it was armed (arming raises the epoch, so an epoch
// read before the subscription never equals one read after it).
func (g *Guard) noWriteHeard(then, now uint64) bool {
	return g.local != nil && then != 0 && then == now && g.local.sub.Load() != nil
}

// fill runs a miss (step 5) through a flight shared with the other callers
// of the ID in this process (see join). held is the key's lock if the
// caller's read took it (see lockWithRead): the flight the caller starts
// loads under it; if the caller joins a flight already under way instead,
// it gives the lock back.
func fill[T any](ctx context.Context, g *Guard, id, vkey string, load LoadFunc[T], from since, held *lock.Lock) (T, error) {
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
		if r, err := g.readShared(ctx, id, vkey, from, false); err == nil {
			early.v, early.ok, early.err = answerRead(ctx, g, id, vkey, r, load, from)
		}
		return early.ok
	}
	j, err := joinServed(ctx, g, flightKey{vkey: vkey}, from, flight[T]{g: g, id: id, vkey: vkey, load: load, held: held}, (*flight[T]).run, reread)
	switch {
	case early.ok:
		return early.v, early.err
	case downOrRefusing(err): // the lock or the re-check failed: Redis cannot fill
		return loadThrough(ctx, g, id, vkey, load, from, err)
	}
	return answerJoined(ctx, g, id, j, err, false)
}

// flightResult is what one flight hands to all its callers: the frame to
// decode (each caller decodes its own copy, so no two callers share a T),
// and how it ended.
type flightResult struct {
	frame   []byte
	outcome outcome
	ttl     time.Duration // the TTL it wrote the frame with, or the re-check found it with (0: unknown)
	sent    time.Time     // with ttl: a clock read before the round trip that wrote or read it (see local.put)
	epoch   uint64        // the local cache's epoch when the flight began
	started uint64        // its number from Guard.starts, taken before the reads it answers from (see since)
	by      any           // the *flight[T] that ran
}

// flight is the state of one flight (a fill, a load-through, a refresh, or
// a GetMany member). Only the flight writes it (run and the Filler methods,
// which the Coordinator calls from the flight's goroutine), and the caller
// that started it reads it after the flight returned: it needs no lock.
type flight[T any] struct {
	g        *Guard
	id, vkey string
	load     LoadFunc[T]

	held      *lock.Lock // the key's lock, taken by the caller's read (see lockWithRead), or nil
	heldClaim int32      // who uses held, the first to claim it (claimHeld; an int32 because join copies a prototype call)

	waiter   coord.Waiter // told when the Coordinator waits for another holder (GetMany's batch), or nil
	refresh  bool         // a refresh ahead of expiry: an entry past its refresh-at time does not answer
	epoch    uint64       // the local cache's epoch when the flight began (0 without Options.Local)
	began    time.Time    // with Options.Local: a clock read before the lock attempt and its re-check (see local.put)
	loadedAt uint64       // the last load's number from Guard.starts, taken as it began (0: no load)

	found   flightResult // what the re-check or the load found
	err     error        // the answer's error: ErrNotFound after a marker, or the load's failure
	v       T            // the value decoded from found.frame: on a hit, or by keep when the local cache keeps values decoded
	decoded bool         // v holds it
	kept    bool         // the current load's answer is in the local cache (keep)
}

// run is the flight: step 5 of the package doc, once for the callers of the
// ID in this process. It passes the gate itself: it can outlive the caller
// that started it.
func (c *flight[T]) run(ctx context.Context) (flightResult, error) {
	g := c.g
	pass, err := g.sup.enter()
	if err != nil {
		return flightResult{outcome: outFailed}, err
	}
	defer g.sup.leave(pass)
	if !g.sup.hold() { // Close and flush wait for the flight
		return flightResult{outcome: outFailed}, ErrClosed
	}
	defer g.sup.end()
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
	fl.epoch, fl.started, fl.by = c.epoch, started, c
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
// found is kept too, for the TTL the re-check read with it (see keeping);
// a marker is not (as on the read path).
func (c *flight[T]) keep(fl flightResult) {
	g := c.g
	if fl.ttl <= 0 {
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
	g.local.put(c.id, fl.frame, value, fl.ttl, fl.sent, fl.epoch)
	c.kept = true
}

// Claims on call.held: the caller's read took the key's lock, and either
// the flight the caller started loads under it, or the caller gives it back
// once join returns (it joined another flight, or left before its own
// began). Whichever claims it first.
const (
	heldByFlight = 1 + iota
	heldByCaller
)

// claimHeld claims c.held for who, and reports whether who got it.
func (c *flight[T]) claimHeld(who int32) bool {
	return c.held != nil && atomic.CompareAndSwapInt32(&c.heldClaim, 0, who)
}

// coordinate runs the miss through the Coordinator (see coord.Coordinator):
// one load per ID across processes, written only while its lock is its own.
// Under the lock the caller's read took, it starts at the load (RunHeld).
func (c *flight[T]) coordinate(ctx context.Context) (flightResult, error) {
	var f coord.Filler = c
	if c.g.local != nil {
		f = keeping[T]{c}
	}
	if c.g.local != nil {
		c.began = time.Now()
	}
	var err error
	if c.claimHeld(heldByFlight) {
		err = c.g.coord.RunHeld(ctx, c.held, c.vkey, c.g.field(), f)
	} else {
		err = c.g.coord.Run(ctx, c.vkey, c.g.field(), f)
	}
	switch {
	case err == nil:
		return c.found, c.err // c.err is ErrNotFound after a marker
	case errors.Is(err, coord.ErrBusy):
		return flightResult{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", c.g.name, c.id, ErrBusy)
	case errors.Is(err, ErrUnavailable):
		return flightResult{outcome: outFailed}, c.g.fail(ctx, "fill", c.id, err)
	}
	return flightResult{outcome: outFailed}, err
}

// Waiting passes the Coordinator's news on to the call's waiter
// (coord.Waiter).
func (c *flight[T]) Waiting() {
	if c.waiter != nil {
		c.waiter.Waiting()
	}
}

// Cached judges a cache entry (coord.Filler): see decodeEntry.
func (c *flight[T]) Cached(ctx context.Context, raw []byte) bool {
	if c.refresh && pastRefreshAt(raw) {
		return false // still the value to refresh: load it
	}
	e := decodeEntry[T](ctx, c.g, c.vkey, raw)
	if e.ok {
		c.found, c.err, c.v, c.decoded = e.found, e.err, e.v, e.err == nil
	}
	return e.ok
}

// keeping is a flight that keeps what it finds in the local cache
// (Options.Local): a coord.TTLFiller, so that the lock attempt's re-check
// reads the entry's TTL too and the flight can keep what it found (see
// keep). Without it, a copy that expired in memory before its entry did in
// Redis sent every Get of the key to a flight of its own until the entry
// expired there too (docs/design-notes.md has the figures).
type keeping[T any] struct{ *flight[T] }

// CachedTTL is Cached for an entry that expires in ttl
// (coord.TTLFiller): the flight then keeps it for that long at most.
func (k keeping[T]) CachedTTL(ctx context.Context, raw []byte, ttl time.Duration) bool {
	if !k.Cached(ctx, raw) {
		return false
	}
	if k.err == nil {
		k.found.ttl, k.found.sent = ttl, k.began
	}
	return true
}

// Load calls the load function (coord.Filler) under LoadTimeout and returns
// the frame to cache: the value's, or an empty marker when it said
// ErrNotFound.
func (c *flight[T]) Load(ctx context.Context) (_ []byte, _ time.Duration, err error) {
	g := c.g
	defer func() {
		if p := recover(); p != nil { // a panicking load is a failed one: counted so, then raised again
			g.loaded(1, ErrLoaderPanic)
			panic(p)
		}
		g.loaded(1, err)
	}()
	c.decoded, c.kept = false, false
	c.loadedAt = g.starts.Add(1) // before the load reads: see join
	done := func(error) {}
	if c.waiter == nil && g.tel != nil { // a batch records its own call
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
	c.found, c.err = flightResult{frame: frame, outcome: outLoaded, ttl: ttl}, nil
	if g.local != nil {
		c.found.sent = time.Now() // before the write: its TTL counts from later (see local.put)
	}
	return frame, ttl, nil
}

// Waited records a wait on another process's load (coord.WaitObserver).
func (c *flight[T]) Waited(ctx context.Context, began time.Time, result string) {
	c.g.tel.waited(ctx, began, result)
}

// loadPanic is a load's panic, raised again in the flight with the stack of
// the load's goroutine, which flightgroup.Group reports instead of its own.
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
// here, in the flight, where flightgroup.Group turns it into ErrLoaderPanic.
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

// loadThrough answers a Get from the load function alone, without Redis:
// the outage policy. cause is the Redis failure that sent it here. Loads are
// merged per ID in this process (a flight keyed apart from the fill flights)
// under the same started-after rule as fill (join), and capped by MaxLoads.
func loadThrough[T any](ctx context.Context, g *Guard, id, vkey string, load LoadFunc[T], from since, cause error) (T, error) {
	var zero T
	if g.outage.failFast || ctx.Err() != nil { // a caller whose ctx ended (its read timed out) gets nothing from a load
		return zero, cause
	}
	j, err := joinServed(ctx, g, flightKey{kind: throughFlight, vkey: vkey}, from, flight[T]{g: g, id: id, vkey: vkey, load: load}, (*flight[T]).runThrough, nil)
	return answerJoined(ctx, g, id, j, err, true)
}

// runThrough is the flight of a load-through: one load, no Redis.
func (c *flight[T]) runThrough(ctx context.Context) (flightResult, error) {
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
