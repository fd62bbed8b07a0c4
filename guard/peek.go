package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
)

// Peek does Get's read round trip (bloom probe and cache GET) without
// loading, for HTTP middleware that turns unknown IDs away, and reports
// whether id may exist: false when the filter has never seen it or an empty
// marker is cached. The context it returns carries what it read, so that
// the next Get of id on this Guard with it (or a context derived from it)
// skips its own read (peekedFor, get.go); any later Get reads afresh. A
// malformed id gives ErrInvalidKey without a Redis command; Redis failures
// wrap ErrUnavailable; after Close, ErrClosed. A filter that is not ready
// answers true (fail open). Before the Guard's first Get it asks the filter
// alone. It waits for Redis at most peekWait whatever ctx; when Redis did
// not answer, the context it returns makes that Get load through.
func (g *Guard) Peek(ctx context.Context, id string) (context.Context, bool, error) {
	// Its Redis work runs under bounded(ctx, peekWait); the context it
	// returns derives from ctx alone.
	pass, err := g.sup.enter()
	if err != nil {
		return ctx, false, err
	}
	defer g.sup.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		return ctx, false, err
	}
	rctx, cancel := g.bounded(ctx, peekWait)
	defer cancel()
	d, ok := ctx.Deadline() // is peekWait, not the caller's deadline, the bound (see errPeekWait)?
	own := peekWait < g.opts.Tuning.RedisTimeout && (!ok || d.After(time.Now().Add(peekWait)))
	if g.bound.Load() == nil { // before the first Get: the entry's field (its type's) is not known
		exists, err := g.MayExist(rctx, id)
		return ctx, exists, err
	}
	if g.local != nil {
		if _, st := g.local.get(id); st == localFresh { // Get will answer from memory
			return ctx, true, nil
		}
	}
	var r readResult
	replays := g.unw.replayed.Load()
	var epoch uint64
	if g.local != nil {
		epoch = g.local.epoch.Load() // before the read: the Get keeps a copy of it only if no write was heard since
	}
	done, err := g.outage.before()
	if err != nil { // the breaker is open: Redis is not asked
		err = fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err)
	} else {
		r, err = g.read(rctx, id, vkey, true)
		if own && ctx.Err() == nil && (rctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
			g.outage.after(done, fmt.Errorf("%w: %w", errPeekWait, err)) // not Redis failing the Guard's bound
		} else {
			g.outage.after(done, err)
		}
	}
	if downOrRefusing(err) && !g.unw.has(id) { // as Get: the copy answers what it has never seen
		if err := g.absentInCopy(ctx, id, err); err != nil {
			return ctx, false, err
		}
	}
	if downOrRefusing(err) && ctx.Err() == nil { // Redis, not the caller, ran out: the Get loads through
		return context.WithValue(ctx, peekKey{}, &peeked{g: g, id: id, replays: replays, failed: err}), false, err
	}
	if err != nil {
		return ctx, false, err
	}
	if r.verdict == verdictUnconfirmed {
		return ctx, false, g.unconfirmed(ctx, id, nil)
	}
	if g.unw.has(id) || g.unw.replayed.Load() != replays { // as in get: it may have read what a write replaced (the Get loads through)
		g.giveBack(ctx, r.held, vkey)
		return ctx, true, nil
	}
	exists := true
	switch { // answered here: the middleware writes 404 without a Get
	case r.verdict == verdictRejected:
		g.answered(ctx, outRejected, false, false)
		exists = false
	case r.verdict == verdictEntry && len(r.raw) == 1 && r.raw[0] == codec.KindEmpty:
		g.answered(ctx, outEmpty, false, false)
		exists = false
	}
	return context.WithValue(ctx, peekKey{}, &peeked{g: g, id: id, r: r, replays: replays, epoch: epoch, answered: !exists}), exists, nil
}

// peekWait bounds Peek's wait for Redis (RedisTimeout, if shorter): the
// middleware's read is a shortcut, and a Redis that has not answered by
// then is treated as down for this request (its Get loads through at
// once), so a frozen Redis delays a request by this much, not RedisTimeout.
const peekWait = 100 * time.Millisecond

// errPeekWait marks a read that ran out of peekWait alone: the breaker
// neither counts it as Redis failing nor as Redis answering (a Redis
// slower than peekWait but within RedisTimeout still serves other Gets).
var errPeekWait = errors.New("no answer within the middleware's wait")

// MayExist asks only the bloom filter whether id may exist (one GETRANGE):
// false means the ID certainly does not. Its errors are Peek's, and a
// filter that is not ready answers true (fail open).
func (g *Guard) MayExist(ctx context.Context, id string) (bool, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return false, err
	}
	defer g.sup.leave(pass)
	if err := g.keys.Check(id); err != nil {
		return false, err
	}
	f, err := g.filter(ctx)
	if err != nil {
		return false, err
	}
	maybe, err := f.Test(ctx, id)
	notReady := errors.Is(err, bloom.ErrNotReady)
	maybe, err = g.filterSays(ctx, id, maybe, err)
	if unw := g.unw.has(id); unw { // an Add that has not reached the filter yet
		maybe = maybe || err == nil
	} else if notReady || downOrRefusing(err) { // as Get: the copy answers what it has never seen
		if err := g.absentInCopy(ctx, id, err); err != nil {
			return false, err
		}
	}
	if err == nil && !maybe {
		g.answered(ctx, outRejected, false, false)
	}
	return maybe, err
}

// peekKey is the context key under which Peek leaves what it read.
type peekKey struct{}

type peeked struct {
	g        *Guard
	id       string
	r        readResult
	failed   error       // the read could not reach Redis: the Get loads through without waiting for it again
	replays  uint64      // unwritten.replayed before the read: the Get checks it as its own (see get)
	epoch    uint64      // the local cache's epoch before the read (0 without Local): the Get's own (see get)
	answered bool        // Peek counted its "not found" (the middleware's 404): the Get answers it uncounted
	used     atomic.Bool // a peek serves one Get: a later Get in the same request reads afresh
}
