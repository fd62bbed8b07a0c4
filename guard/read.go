package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/lock"
)

// Step 3, the read: one round trip per Get (the HGET of the type's field,
// with the bloom probe and the key's lock pipelined when the read plan
// expects a miss), shared with concurrent Gets' reads but never sent before
// the Get started. The plan (lock with the read, seen table, lock bias,
// probe credit) learns from what reads found; docs/design.md has the reasons.

// reader is the read path's state (Guard.rd).
type reader struct {
	batch    *batch.Batcher[readReq]   // every Get's read goes through it: concurrent reads share round trips (see runReads)
	calls    sync.Pool                 // of *batch.Call[readReq], reused by read
	shared   readGroup                 // one Redis read per value key at a time, in its first caller (InCaller: see readShared)
	credit   atomic.Int64              // > 0: recent reads missed: send the bloom probe with the HGET (see read)
	locks    *lock.Client              // the locks reads take (see lockWithRead)
	lockBias atomic.Int64              // > 0: reads that found nothing mostly loaded, and their locks were used (see Lock bias)
	seen     atomic.Pointer[seenTable] // the IDs read lately, once a miss opened the gate (see lockWithRead)
	ctxBound bool                      // the client bounds socket reads by ctx deadlines (see sendRead)
}

// verdict is what the read round trip found.
type verdict uint8

const (
	verdictMiss        verdict = iota // no entry, and the filter says maybe (or cannot say)
	verdictRejected                   // no entry, and the filter says absent
	verdictEntry                      // a cached value or empty marker: raw
	verdictUnconfirmed                // no entry, the filter not ready, and its copy says absent (see absentInCopy)
)

type readResult struct {
	verdict verdict
	raw     []byte
	life    lifetime   // the entry's remaining TTL in Redis, read with it when Local is on
	through error      // not nil: the Get loads through, for this reason (Redis cannot answer, a write not landed)
	held    *lock.Lock // a miss's lock, taken with the read (see lockWithRead); the Get's flight uses it or gives it back
}

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
	f := g.bf.f.Load()
	c := g.rd.calls.Get().(*batch.Call[readReq])
	r := &c.Req
	withTTL := g.local != nil
	*r = readReq{id: id, vkey: vkey, withTTL: withTTL}
	r.deadline, _ = ctx.Deadline()
	probing := f != nil && g.rd.probing(withTTL)
	if probing {
		r.f = f
		if lockable && g.lockWithRead(id) {
			r.lockKey = keyspace.Lock(vkey)
		}
	}
	var sent time.Time
	if withTTL {
		sent = time.Now()
	}
	if err := g.sendRead(ctx, c); err != nil { // c may still be answered: not reused; a lock it took lapses
		return readResult{}, g.readFailed(ctx, "read", id, err)
	}
	raw, err := r.get.Bytes()
	var held *lock.Lock
	if r.lockQ != nil {
		held, _ = r.lockQ.Result(ctx) // not taken (another flight holds it, or Redis failed): the flight attempts as before
	}
	var ttl time.Duration
	if withTTL {
		ttl = max(r.pttl.Val(), 0)
	}
	probe := r.probe
	*r = readReq{}
	g.rd.calls.Put(c)
	switch {
	case err == nil:
		if held != nil { // another process filled it: a lock for nothing
			g.giveBack(ctx, held, vkey)
			g.lockUseless()
		}
		g.sawRead(id)
		g.rd.settle(withTTL, probing, 1, 0)
		return readResult{verdict: verdictEntry, raw: raw, life: lifetime{ttl: ttl, sent: sent}}, nil
	case !errors.Is(err, redis.Nil):
		g.giveBack(ctx, held, vkey)
		return readResult{}, g.readFailed(ctx, "read", id, err)
	}
	g.rd.settle(withTTL, probing, 0, 1)
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
		g.giveBack(ctx, held, vkey)
	case res.verdict == verdictMiss:
		res.held = held
		g.lockUseful() // first: the first miss makes the table
		g.sawRead(id)
	default: // rejected: no load follows, and the lock lapses (see lockWithRead)
		g.lockUseless()
	}
	return res, err
}

// sendRead sends a read (possibly with others: see runReads). A client
// that bounds its socket reads by the ctx (ContextTimeoutEnabled) runs it
// in the caller's goroutine. With any other client a stalled Redis would
// hold the caller until the client's ReadTimeout and retries, past its
// deadline: a read under a deadline then runs detached, in a goroutine of
// its own even alone (the supervisor's, which ends when the client gives
// up), and the caller waits for it at most half the time it has left,
// keeping the rest to load through.
func (g *Guard) sendRead(ctx context.Context, c *batch.Call[readReq]) error {
	deadline, ok := ctx.Deadline()
	c.Detached, c.Until = false, time.Time{}
	if !g.rd.ctxBound && ok {
		now := time.Now()
		c.Detached, c.Until = true, now.Add(deadline.Sub(now)/2)
	}
	err := g.rd.batch.Do(ctx, c)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("read: no answer in half the Get's time left: %w", err)
	}
	return err
}

// readFailed is what a read that got no answer returns, whether it failed
// in Redis or waited for a round trip past its ctx. A cancelled caller (a
// client that disconnected) gets ctx.Err() alone: not Redis failing, so
// neither logged nor counted by the breaker. Anything else wraps
// ErrUnavailable, a deadline too: the round trip did not end in time,
// Redis is slow or gone, and the breaker must hear it (or every Get would
// queue behind a frozen Redis until its deadline).
func (g *Guard) readFailed(ctx context.Context, op, id string, err error) error {
	if errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return g.fail(ctx, op, id, redisfail.Wrap(err))
}

// verdict turns the filter's answer for an ID with no cache entry into the
// read's result.
func (g *Guard) verdict(ctx context.Context, id string, maybe bool, err error) (readResult, error) {
	notReady := errors.Is(err, bloom.ErrNotReady)
	if maybe, err = g.filterSays(ctx, id, maybe, err); err != nil {
		return readResult{}, err
	}
	switch {
	case !maybe:
		return readResult{verdict: verdictRejected}, nil
	case notReady && g.copySaysAbsent(id):
		return readResult{verdict: verdictUnconfirmed}, nil
	}
	return readResult{verdict: verdictMiss}, nil
}

// filterSays turns a bloom answer into the Guard's: a filter that is not
// ready means "maybe" (fail open: counted, logged once per episode, and a
// rebuild started if Filter.IDs is set); Redis failures wrap ErrUnavailable.
func (g *Guard) filterSays(ctx context.Context, id string, maybe bool, err error) (bool, error) {
	switch {
	case err == nil:
		if g.bf.bypassing.Load() && g.bf.bypassing.CompareAndSwap(true, false) {
			g.log.InfoContext(ctx, "cacheguard: bloom filter answering again")
		}
		return maybe, nil
	case errors.Is(err, bloom.ErrNotReady):
		g.stats.bypasses.Add(1)
		if g.bf.bypassing.CompareAndSwap(false, true) {
			g.logNotReady(ctx)
		}
		g.autoRebuild("filter not ready")
		g.wakeCopy() // a new generation may follow: the copy fetches it as soon as it is ready
		return true, nil
	default:
		return false, g.readFailed(ctx, "bloom probe", id, err)
	}
}

// logNotReady says what reads get while the filter is not ready: with the
// copy of the filter this process holds (it saw the filter ready), IDs it
// has never seen answer ErrUnconfirmed and the others load; without one,
// every ID loads (fails open). Without Filter.IDs that lasts until Rebuild
// is called: an ERROR.
func (g *Guard) logNotReady(ctx context.Context) {
	const lost = "cacheguard: bloom filter not ready (never rebuilt, or lost by Redis): "
	held := g.copyHeld()
	reads := "unknown IDs reach the database (this process holds no copy of the filter)"
	if held {
		reads = "IDs this process's copy of the filter has not seen answer ErrUnconfirmed (503), the others reach the database"
	}
	if g.opts.Filter.IDs == nil {
		g.log.ErrorContext(ctx, lost+reads+" until you call Rebuild (Options.Filter.IDs is not set)", "local_copy", held)
		return
	}
	g.log.WarnContext(ctx, lost+reads+" while it is rebuilt from Options.Filter.IDs", "local_copy", held)
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
	lockQ *lock.Queued
}

// Read batching. Gets that read while readsInFlight round
// trips of reads are already under way wait, and the first of them sends all
// of theirs in one pipeline when one ends (package batch). A waiting read
// is sent after its Get started, so the rule of join holds, and the waiting
// reads of one key share one HGET (and one probe, whichever of them asks for
// it; a read that takes the lock goes alone): a hot key costs one command
// per round trip, not one per caller. The system calls and Redis event-loop
// turns per read fall with the batch (docs/benchmarks.md, Read batching).
// readBatchMax bounds one pipeline.
const (
	readsInFlight = 2
	readBatchMax  = 256
)

// runReads sends calls' reads in one round trip. A read alone that needs
// only the value is one command, as a plain GET is; anything else is a
// pipeline. A round trip that carries several Gets' reads runs in a
// goroutine of its own (package batch) on the leading caller's ctx without
// its cancellation, until the latest of their deadlines, and at most
// RedisTimeout; each Get, the leading one too, leaves at its own.
func (g *Guard) runReads(ctx context.Context, calls []*batch.Call[readReq]) {
	field := g.bound.Load().fieldArg // every read follows a bind
	due := g.marks.due()             // a check of the marks rides along (lost.go)
	if len(calls) == 1 && calls[0].Req.f == nil && !calls[0].Req.withTTL && calls[0].Req.lockKey == "" && !due {
		r := &calls[0].Req
		// rdb.HGet would box the field into the command's arguments on
		// every call; fieldArg is boxed once, by bind.
		r.get = redis.NewStringCmd(ctx, "hget", r.vkey, field)
		_ = g.rdb.Process(ctx, r.get)
		g.endCheck(ctx, nil) // the HGET dialed (Redis back, or a restart no command saw): check before it answers
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
	chk := g.queueCheck(ctx, pipe)
	var first map[string]*readReq // each value key's first read: the key's other reads share its commands
	if len(calls) > 1 {
		first = make(map[string]*readReq, len(calls))
	}
	for _, c := range calls {
		r := &c.Req
		if first != nil && r.lockKey == "" { // a read that takes the lock is its caller's alone
			if o := first[r.vkey]; o != nil && o.withTTL == r.withTTL {
				r.get, r.pttl = o.get, o.pttl
				// A Guard has one Filter (connect sets it once; a rebuild
				// switches generations inside it), so o.f is nil or r.f.
				if r.f != nil {
					if o.f == nil { // the key's first read has no probe: queue one, for its next reads too
						o.f, o.probe = r.f, r.f.Queue(ctx, pipe, r.id)
					}
					r.probe = o.probe
				}
				continue
			}
			first[r.vkey] = r
		}
		if r.f != nil {
			r.probe = r.f.Queue(ctx, pipe, r.id)
		}
		if r.lockKey != "" { // before the HGET: Redis runs it with the lock taken, as the re-check
			r.lockQ, _ = g.rd.locks.Queue(ctx, pipe, r.lockKey, readLockLease)
		}
		r.get = redis.NewStringCmd(ctx, "hget", r.vkey, field)
		_ = pipe.Process(ctx, r.get)
		if r.withTTL {
			r.pttl = pipe.PTTL(ctx, r.vkey)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	g.endCheck(ctx, chk)  // before the read answers: it may hold an entry whose write Redis lost
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
