package guard

import (
	"context"
	"fmt"
)

// Get, the five steps of the package doc, top-down in get: memory answers
// first (Local), then one read (read.go) answers a value, a reject or a
// marker; a miss joins its flight (flight.go); an ID whose write Redis has
// not taken, or a Redis that cannot answer, loads through.

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

// get is the five steps of a Get, top-down (g and load are not nil: Get
// checked them).
func get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	var zero T
	if err := bind[T](g); err != nil {
		return zero, err
	}
	// Before the local copy too: a read made after a failover, before the
	// Guard knew of it, may have kept the entry a lost write had replaced.
	if g.unw.has(id) { // its write has not reached Redis yet: the entry may be the one it replaces
		return getUnwritten(ctx, g, id, load)
	}
	gone := false // the local copy expired with its Redis entry
	if g.local != nil {
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
	from := since{at: g.starts.Load()} // a flight that answers this Get must have started after it (join)
	replays := g.unw.replayed.Load()   // a replay landing during the read: see below
	if g.local != nil {
		from.epoch = g.local.epoch.Load() // before the read: see local.put
	}
	// Step 3 in this goroutine: a hit, a reject or a marker is answered
	// from a read made after this Get started, never from another caller's
	// (with Local, from one shared with the ID's other callers if no write
	// was heard since it started: see readShared).
	var r readResult
	p := peekedFor(ctx, g, id)
	if p != nil && p.answered { // counted by Peek
		return zero, ErrNotFound
	}
	if p != nil && p.failed != nil { // Peek found Redis unable to answer (it asked the copy): do not wait for it twice
		return loadThrough(ctx, g, id, vkey, load, from, p.failed)
	}
	ok := p != nil
	if ok {
		r, replays = p.r, p.replays // the replays that landed since Peek's read count too
	}
	if !ok && gone && !g.outage.troubled.Load() {
		// The entry has expired in Redis: a read would miss. The lock
		// attempt's re-check reads whatever another process stored since.
		r, ok = readResult{verdict: verdictMiss}, true
	}
	if !ok {
		done, err := g.outage.before()
		if err != nil { // the breaker is open: Redis is not asked (nor counted as failing)
			err = fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err)
		} else {
			r, err = g.readFor(ctx, id, vkey, from)
			g.outage.after(done, err)
		}
		if downOrRefusing(err) {
			if err := g.absentInCopy(ctx, id, err); err != nil {
				return zero, err
			}
			return loadThrough(ctx, g, id, vkey, load, from, err)
		}
		if err != nil {
			return zero, err
		}
	}
	// The read's check found the ID's write lost by Redis (lost.go), or a
	// replay landed while it read: the entry may be the one a write replaced.
	if g.unw.has(id) || g.unw.replayed.Load() != replays {
		g.giveBack(r.held, vkey)
		return loadThrough(ctx, g, id, vkey, load, from, fmt.Errorf("cacheguard: %s %q: %w", g.name, id, errUnwritten))
	}
	if v, ok, err := answerRead(ctx, g, id, vkey, r, load, from); ok {
		return v, err
	}
	return fill(ctx, g, id, vkey, load, from, r.held)
}

// peekedFor is the read a Peek left in ctx for this Get, if any (nil: none).
func peekedFor(ctx context.Context, g *Guard, id string) *peeked {
	p, ok := ctx.Value(peekKey{}).(*peeked)
	if !ok || p.g != g || p.id != id || p.used.Swap(true) {
		return nil
	}
	return p
}

// getUnwritten answers a Get of an ID whose last write did not reach Redis
// from the load function alone, as in an outage, until the write is
// replayed (replay.go).
func getUnwritten[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	pass, err := g.sup.enter()
	if err != nil {
		var zero T
		return zero, err
	}
	defer g.sup.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		var zero T
		return zero, err
	}
	cause := fmt.Errorf("cacheguard: %s %q: %w", g.name, id, errUnwritten)
	return loadThrough(ctx, g, id, vkey, load, since{at: g.starts.Load()}, cause)
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

// answerRead answers a Get from a read: a reject or a marker
// (ErrNotFound) or a value, which it keeps in the local cache and perhaps
// refreshes. ok is false when the read answers nothing (a miss, or a
// corrupt entry, dropped): load.
func answerRead[T any](ctx context.Context, g *Guard, id, vkey string, r readResult, load LoadFunc[T], from since) (v T, ok bool, err error) {
	switch r.verdict {
	case verdictRejected:
		g.answered(ctx, outRejected, false, false)
		return v, true, ErrNotFound
	case verdictUnconfirmed:
		return v, true, g.unconfirmed(ctx, id, nil)
	case verdictEntry:
		if e := decodeEntry[T](ctx, g, vkey, r.raw); e.ok {
			g.answered(ctx, e.found.outcome, false, false)
			if e.err == nil && g.local != nil {
				g.local.put(id, r.raw, kept(g, e.v), r.ttl, r.sent, from.epoch)
			}
			if e.err == nil && g.opts.RefreshAhead {
				refresh(g, id, vkey, r.raw, load)
			}
			return e.v, true, e.err
		}
	}
	return v, false, nil
}
