package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/internal/redislock"
)

// verdict is what the read round trip found.
type verdict uint8

const (
	verdictMiss     verdict = iota // no entry, and the filter says maybe (or cannot say)
	verdictRejected                // no entry, and the filter says absent
	verdictEntry                   // a cached value or empty marker: raw
)

type readResult struct {
	verdict verdict
	raw     []byte
	ttl     time.Duration   // the entry's remaining TTL in Redis, read with it when Local is on (0: unknown)
	held    *redislock.Lock // a miss's lock, taken with the read (see lockWithRead); the Get's flight uses it or gives it back
}

// Probe order. While reads mostly hit, the HGET goes alone: a hit is one
// command, like a plain GET. A read that finds nothing must then ask the
// filter in a second round trip, so every such read adds missCredit to
// credit, and while credit is above zero reads send the bloom probe and the
// HGET together (pipelined): a flood of unknown IDs costs one round trip
// each after the first. Every hit takes one back. At a steady hit ratio h
// the pipelined share settles where h·1 = (1−h)·missCredit; with
// missCredit 16 reads go alone once more than about 94% of them hit. A new
// Guard starts with missCredit (New): its first reads are likely misses.
const (
	missCredit = 16
	maxCredit  = 1024
)

// read is the one round trip of every Get (step 3): the HGET of this
// version's field of the value key, with the bloom probe pipelined before
// it when recent reads missed (see missCredit), and with the entry's PTTL
// when Local is on (a local copy must not outlive its entry). With
// lockable, a read likely to miss takes the key's lock too, before the
// HGET (see lockWithRead); a miss returns it in readResult.held, for the
// Get's flight. Concurrent reads share round trips (see runReads). Redis
// failures come back wrapping ErrUnavailable, and so does a deadline that
// passes while the read waits for a round trip (Redis too slow); a
// cancelled caller gets context.Canceled alone.
func (g *Guard) read(ctx context.Context, id, vkey string, lockable bool) (readResult, error) {
	f := g.bloom.Load()
	c := g.readCalls.Get().(*batch.Call[readReq])
	r := &c.Req
	withTTL := g.local != nil
	*r = readReq{id: id, vkey: vkey, withTTL: withTTL}
	r.deadline, _ = ctx.Deadline()
	probing := f != nil && (withTTL || g.credit.Load() != 0)
	if probing {
		r.f = f
		if lockable && g.lockWithRead(id) {
			r.lockKey = keyspace.Lock(vkey)
		}
	}
	if err := g.readBatch.Do(ctx, c); err != nil { // c may still be answered: not reused; a lock it took lapses
		return readResult{}, g.readFailed(ctx, id, err)
	}
	raw, err := r.get.Bytes()
	var held *redislock.Lock
	if r.lockQ != nil {
		held, _ = r.lockQ.Result(ctx) // not taken (another flight holds it, or Redis failed): the flight attempts as before
	}
	var ttl time.Duration
	if withTTL {
		ttl = max(r.pttl.Val(), 0)
	}
	probe := r.probe
	*r = readReq{}
	g.readCalls.Put(c)
	switch {
	case err == nil:
		if held != nil { // another process filled it: a lock for nothing
			g.giveBack(held, vkey)
			g.lockUseless()
		}
		g.sawRead(id)
		if probing && !withTTL {
			if c := g.credit.Add(-1); c < 0 {
				g.credit.Add(1) // raced below zero: put it back
			}
		}
		return readResult{verdict: verdictEntry, raw: raw, ttl: ttl}, nil
	case !errors.Is(err, redis.Nil):
		g.giveBack(held, vkey)
		return readResult{}, g.readFailed(ctx, id, err)
	}
	if !withTTL && g.credit.Add(missCredit) > maxCredit {
		g.credit.Store(maxCredit)
	}
	var maybe bool
	switch {
	case f == nil: // not opened yet (New without Redis): fail open
		_, err = g.filterSays(ctx, id, false, bloom.ErrNotReady)
		return readResult{verdict: verdictMiss}, err
	case probing:
		maybe, err = probe.Result(ctx)
	default: // the value went alone: ask the filter now
		maybe, err = f.Test(ctx, id)
	}
	res, err := g.verdict(ctx, id, maybe, err)
	switch {
	case err != nil:
		g.giveBack(held, vkey)
	case res.verdict == verdictMiss:
		res.held = held
		g.lockUseful() // first: the first miss makes the table
		g.sawRead(id)
	default: // rejected: no load follows, and the lock lapses (see lockWithRead)
		g.lockUseless()
	}
	return res, err
}

// readFailed is what a read that got no answer returns, whether it failed
// in Redis or waited for a round trip past its ctx. A cancelled caller (a
// client that disconnected) gets ctx.Err() alone: not Redis failing, so
// neither logged nor counted by the breaker. Anything else wraps
// ErrUnavailable, a deadline too: the round trip did not end in time,
// Redis is slow or gone, and the breaker must hear it (or every Get would
// queue behind a frozen Redis until its deadline).
func (g *Guard) readFailed(ctx context.Context, id string, err error) error {
	if errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return g.fail(ctx, "read", id, redisfail.Wrap(err))
}

// readReq is one read in a batch (read, runReads): what to send, then the
// commands that carry the answers.
type readReq struct {
	id, vkey string
	f        *bloom.Filter // probe this filter too; nil: the value alone
	withTTL  bool          // read the entry's PTTL too (Local)
	deadline time.Time     // the Get's ctx's, if it has one
	lockKey  string        // take this lock before the HGET (see lockWithRead); "": no

	get   *redis.StringCmd
	probe bloom.Probe
	pttl  *redis.DurationCmd
	lockQ *redislock.Queued
}

// Read batching. Gets that read while Options.Tuning.ReadsInFlight round
// trips of reads are already under way wait, and the first of them sends all
// of theirs in one pipeline when one ends (package batch). Each read is still
// its own commands, so a hit is one HGET and the rule of join holds: a
// waiting read is sent after its Get started. The system calls and Redis
// event-loop turns per read fall with the batch (docs/cost.md has the
// figures). readBatchMax bounds one pipeline.
const readBatchMax = 256

// runReads sends calls' reads in one round trip. A read alone that needs
// only the value is one command, as a plain GET is; anything else is a
// pipeline. A round trip that carries several Gets' reads runs in a
// goroutine of its own (package batch) on the leading caller's ctx without
// its cancellation, until the latest of their deadlines, and at most
// RedisTimeout; each Get, the leading one too, leaves at its own.
func (g *Guard) runReads(ctx context.Context, calls []*batch.Call[readReq]) {
	if len(calls) == 1 && calls[0].Req.f == nil && !calls[0].Req.withTTL && calls[0].Req.lockKey == "" {
		r := &calls[0].Req
		// rdb.HGet would box the field into the command's arguments on
		// every call; fieldArg is boxed once, in New.
		r.get = redis.NewStringCmd(ctx, "hget", r.vkey, g.fieldArg)
		_ = g.rdb.Process(ctx, r.get)
		return
	}
	if len(calls) > 1 {
		end := time.Now().Add(g.opts.Tuning.RedisTimeout)
		if latest := latestDeadline(calls); !latest.IsZero() && latest.Before(end) {
			end = latest
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, end)
		defer cancel()
	}
	pipe := g.rdb.Pipeline()
	for _, c := range calls {
		r := &c.Req
		if r.f != nil {
			r.probe = r.f.Queue(ctx, pipe, r.id)
		}
		if r.lockKey != "" { // before the HGET: Redis runs it with the lock taken, as the re-check
			r.lockQ, _ = g.locks.QueueTry(ctx, pipe, r.lockKey, readLockLease)
		}
		r.get = redis.NewStringCmd(ctx, "hget", r.vkey, g.fieldArg)
		_ = pipe.Process(ctx, r.get)
		if r.withTTL {
			r.pttl = pipe.PTTL(ctx, r.vkey)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
}

// latestDeadline is the latest of calls' deadlines, or zero if one of
// them has none.
func latestDeadline(calls []*batch.Call[readReq]) time.Time {
	var latest time.Time
	for _, c := range calls {
		d := c.Req.deadline
		if d.IsZero() {
			return time.Time{}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return latest
}

// sharedRead is one read shared by the callers of a value key (readShared).
type sharedRead struct {
	r       readResult
	started uint64 // its number from Guard.starts, before the read (see since)
	epoch   uint64 // the local cache's epoch then
}

// readShared is read for a Guard with a local cache: when a hot key's copy
// expires, its callers in this process share one Redis read instead of
// sending one each, under the rule of join: a read that started before the
// caller serves it only if no write was heard in between (the window of a
// local copy); otherwise the caller reads again. Without a local cache
// only a read that started after the caller serves it: fill uses it so
// for the callers that waited for a flight older than them. The first caller reads in
// its own goroutine, on its own ctx, as a Get without Local does; each of
// the others leaves when its own ctx is done, and reads again if the first
// one gave up (see readGroup). With lockable, the read may take the key's
// lock (see lockWithRead); the result carries it to the caller whose read
// it was, and to no other.
func (g *Guard) readShared(ctx context.Context, id, vkey string, from since, lockable bool) (readResult, error) {
	for range 3 { // a second read already starts after this caller: see below
		sr, shared, err := g.reads.do(ctx, vkey, func(ctx context.Context) (sharedRead, error) {
			sr := sharedRead{started: g.starts.Add(1)}
			if g.local != nil {
				sr.epoch = g.local.epoch.Load()
			}
			var err error
			sr.r, err = g.read(ctx, id, vkey, lockable)
			return sr, err
		})
		if err != nil {
			return readResult{}, err
		}
		if shared {
			// A lock the read took (see lockWithRead) is its caller's,
			// for that caller's flight; the others join the flight.
			sr.r.held = nil
		}
		if !from.startedBefore(sr.started) || g.noWriteHeard(sr.epoch, from.epoch) {
			return sr.r, nil
		}
		// A read older than this caller, and a write heard since: the next
		// one starts after this one ended, so after this caller.
	}
	return g.read(ctx, id, vkey, false) // only if reads were forgotten under it again and again: its own
}

// verdict turns the filter's answer for an ID with no cache entry into the
// read's result.
func (g *Guard) verdict(ctx context.Context, id string, maybe bool, err error) (readResult, error) {
	if maybe, err = g.filterSays(ctx, id, maybe, err); err != nil {
		return readResult{}, err
	}
	if !maybe {
		return readResult{verdict: verdictRejected}, nil
	}
	return readResult{verdict: verdictMiss}, nil
}

// filterSays turns a bloom answer into the Guard's: a filter that is not
// ready means "maybe" (fail open: counted, logged once per episode, and a
// rebuild started if RebuildFrom is set); Redis failures wrap ErrUnavailable.
func (g *Guard) filterSays(ctx context.Context, id string, maybe bool, err error) (bool, error) {
	switch {
	case err == nil:
		if g.bypassing.Load() && g.bypassing.CompareAndSwap(true, false) {
			g.log.InfoContext(ctx, "cacheguard: bloom filter answering again")
		}
		return maybe, nil
	case errors.Is(err, bloom.ErrNotReady):
		g.stats.bypasses.Add(1)
		if g.bypassing.CompareAndSwap(false, true) {
			g.log.WarnContext(ctx, "cacheguard: bloom filter not ready (never rebuilt, or lost by Redis); failing open until Rebuild")
		}
		g.autoRebuild()
		return true, nil
	default:
		return false, g.fail(ctx, "bloom probe", id, err)
	}
}

// peekKey is the context key under which Peek leaves what it read.
type peekKey struct{}

type peeked struct {
	g    *Guard
	id   string
	r    readResult
	used atomic.Bool // a peek serves one Get: a later Get in the same request reads afresh
}

func peekedFor(ctx context.Context, g *Guard, id string) (readResult, bool) {
	p, ok := ctx.Value(peekKey{}).(*peeked)
	if !ok || p.g != g || p.id != id || p.used.Swap(true) {
		return readResult{}, false
	}
	return p.r, true
}

// Peek does Get's read round trip (bloom probe and cache GET) without
// loading, and reports whether id may exist: false when the filter has never
// seen it or an empty marker is cached. It returns a context that carries
// what it read, so that the next Get of the same id on this Guard with that
// context (or one derived from it) skips its own read: HTTP middleware built
// on Peek costs no extra round trip. Only that one Get uses it; any later Get
// reads afresh (say, after the handler wrote and invalidated). A malformed id
// gives ErrInvalidKey without a Redis command; Redis failures wrap
// ErrUnavailable; after Close, ErrClosed. A filter that is not ready answers
// true (fail open).
func (g *Guard) Peek(ctx context.Context, id string) (context.Context, bool, error) {
	pass, err := g.gate.enter()
	if err != nil {
		return ctx, false, err
	}
	defer g.gate.leave(pass)
	vkey, err := g.keys.Value(id)
	if err != nil {
		return ctx, false, err
	}
	if g.local != nil {
		if _, st := g.local.get(id); st == localFresh { // Get will answer from memory
			return ctx, true, nil
		}
	}
	done, err := g.outage.before()
	if err != nil { // the breaker is open: Redis is not asked
		return ctx, false, fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err)
	}
	r, err := g.read(ctx, id, vkey, true)
	g.outage.after(done, err)
	if err != nil {
		return ctx, false, err
	}
	exists := true
	switch {
	case r.verdict == verdictRejected:
		g.stats.rejects.Add(1)
		exists = false
	case r.verdict == verdictEntry && len(r.raw) == 1 && r.raw[0] == codec.KindEmpty:
		g.stats.empty.Add(1)
		exists = false
	}
	return context.WithValue(ctx, peekKey{}, &peeked{g: g, id: id, r: r}), exists, nil
}

// MayExist asks only the bloom filter whether id may exist: false means the
// ID certainly does not (one GETRANGE). HTTP middleware uses Peek instead,
// which also reads the cache for the handler's Get. A malformed ID gives
// ErrInvalidKey without a Redis command; a filter that is not ready answers
// true (fail open); Redis failures wrap ErrUnavailable; after Close,
// ErrClosed.
func (g *Guard) MayExist(ctx context.Context, id string) (bool, error) {
	pass, err := g.gate.enter()
	if err != nil {
		return false, err
	}
	defer g.gate.leave(pass)
	if err := g.keys.Check(id); err != nil {
		return false, err
	}
	f, err := g.filter(ctx)
	if err != nil {
		return false, err
	}
	maybe, err := f.Test(ctx, id)
	if maybe, err = g.filterSays(ctx, id, maybe, err); err == nil && !maybe {
		g.stats.rejects.Add(1)
	}
	return maybe, err
}
