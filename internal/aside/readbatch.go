package aside

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/lock"
)

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
func (g *Engine) runReads(ctx context.Context, calls []*batch.Call[readReq]) {
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
	for _, c := range calls {
		r := &c.Req
		if r.f != nil {
			r.probe = r.f.Queue(ctx, pipe, r.id)
		}
		if r.lockKey != "" { // before the HGET: Redis runs it with the lock taken, as the re-check
			r.lockQ, _ = g.rd.locks.QueueTry(ctx, pipe, r.lockKey, readLockLease)
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
