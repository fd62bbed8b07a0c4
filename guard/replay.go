package guard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Failed writes: when Set, Delete, Invalidate or Add cannot reach Redis
// (not when the caller's ctx ended first) the error is returned and the ID
// is kept here. Until its write lands, this process's Gets of it load
// through (the outage policy) instead of reading an entry the write meant
// to replace, and a goroutine of the Guard replays it, with backoff, as
// soon as Redis answers. Every replay is the same safe write: the ID
// joins the filter and its entry (every schema) and load lock are deleted,
// with the invalidation message; the next Get loads what the source of
// truth holds.
//
// Past maxUnwritten IDs the set overflows: every Get of the Guard loads
// through until the held IDs are replayed and all the Guard's entries are
// deleted (a SCAN of each master), and a filter that may lack the IDs
// dropped is rebuilt from Filter.IDs. A process that dies before it
// replays leaves its writes to the entries' TTL (docs/incidents.md).
const (
	maxUnwritten = 10_000
	replayBatch  = 1_000
)

// unwritten is the set of IDs whose writes failed.
type unwritten struct {
	n          atomic.Int64      // len(ids), +1 while overflowed: Gets check it first, without the mutex
	mu         sync.Mutex        // guards the fields below
	ids        map[string]uint64 // ID → the number of its last failure, so a replay does not clear a newer one
	seq        uint64
	overflowed bool // IDs were dropped: every ID counts as unwritten (see has)
	replaying  bool // the replay goroutine runs (started by unwrittenAfter, ended by replayOnce)
	// wake, made by New (buffer 1), starts a replay attempt now: reads
	// succeed again, so the replay need not wait out its backoff.
	wake chan struct{}
}

// has reports whether id's last write failed and was not yet replayed.
func (u *unwritten) has(id string) bool {
	if u.n.Load() == 0 {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.ids[id]
	return ok || u.overflowed
}

// split splits ids (and their keys) into those written and those not.
func (u *unwritten) split(ids, keys []string) (restIDs, restKeys, unwrittenIDs []string) {
	for i, id := range ids {
		if u.has(id) {
			unwrittenIDs = append(unwrittenIDs, id)
			continue
		}
		restIDs, restKeys = append(restIDs, id), append(restKeys, keys[i])
	}
	return restIDs, restKeys, unwrittenIDs
}

// unwrittenAfter keeps ids if err says their write did not reach Redis,
// starts the replay, and returns err.
func (g *Guard) unwrittenAfter(ctx context.Context, ids []string, err error) error {
	if err == nil || !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		return err
	}
	u := &g.unw
	u.mu.Lock()
	if u.ids == nil {
		u.ids = map[string]uint64{}
	}
	for _, id := range ids {
		if _, ok := u.ids[id]; !ok && len(u.ids) >= maxUnwritten {
			u.overflowed = true
			continue
		}
		u.seq++
		u.ids[id] = u.seq
	}
	u.n.Store(int64(len(u.ids)) + b2i(u.overflowed))
	start := !u.replaying
	u.replaying = true
	u.mu.Unlock()
	if start {
		g.log.Warn("cacheguard: a write did not reach redis; this process loads those IDs through until it is replayed", "err", err)
		g.retry(g.replayOnce, func() {}, u.wake)
	}
	return err
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// replayOnce replays up to replayBatch unwritten IDs (and, once they are
// all replayed after an overflow, deletes the Guard's entries). It reports
// done when none is left; it then ends the replay under the mutex, so an
// ID kept after that starts a new one.
func (g *Guard) replayOnce() (done bool) {
	u := &g.unw
	u.mu.Lock()
	batch := make(map[string]uint64, min(len(u.ids), replayBatch))
	for id, seq := range u.ids {
		if len(batch) == replayBatch {
			break
		}
		batch[id] = seq
	}
	overflowed := u.overflowed && len(batch) == len(u.ids)
	if len(batch) == 0 && !u.overflowed {
		u.replaying = false
		u.mu.Unlock()
		return true
	}
	u.mu.Unlock()
	ctx, cancel := context.WithTimeout(g.bg.ctx, 4*g.opts.Tuning.RedisTimeout)
	defer cancel()
	ids := slices.Collect(maps.Keys(batch))
	if err := g.rewrite(ctx, ids); err != nil {
		return false
	}
	if overflowed {
		if err := g.dropEntries(ctx); err != nil {
			return false
		}
		g.bf.stale.Store(true)
		g.autoRebuild()
	}
	u.mu.Lock()
	for id, seq := range batch {
		if u.ids[id] == seq {
			delete(u.ids, id)
		}
	}
	if overflowed {
		u.overflowed = false
	}
	u.n.Store(int64(len(u.ids)) + b2i(u.overflowed))
	u.mu.Unlock()
	g.log.Info("cacheguard: failed writes replayed", "ids", len(ids), "all_entries_dropped", overflowed)
	g.checkRestart(ctx)
	return g.replayOnce() // the next batch, or done
}

// rewrite is the replay of ids' writes, in one round trip: they join the
// filter, and their entries and load locks are deleted, with the message
// that drops in-memory copies elsewhere.
func (g *Guard) rewrite(ctx context.Context, ids []string) error {
	keys, err := g.valueKeys(ids)
	if err != nil {
		return err
	}
	f, err := g.filter(ctx)
	if err != nil {
		return err
	}
	pipe := g.rdb.Pipeline()
	added := f.QueueAdd(ctx, pipe, ids)
	g.queueInvalidate(ctx, pipe, keys)
	_, err = pipe.Exec(ctx)
	g.forget(keys, nil)
	if err == nil {
		err = added.Result(ctx)
	}
	return redisfail.Wrap(err)
}

// dropEntries deletes every value key of the Guard, with its lock, on every
// master: the writes that did not fit the unwritten set are replayed all at
// once.
func (g *Guard) dropEntries(ctx context.Context) error {
	match := g.keys.Values()
	return eachMaster(ctx, g.rdb, func(ctx context.Context, c redis.Cmdable) error {
		it := c.Scan(ctx, 0, match, 1000).Iterator()
		var keys []string
		for it.Next(ctx) {
			if _, ok := g.keys.ID(it.Val()); ok {
				keys = append(keys, voids(it.Val())...)
			}
		}
		if err := it.Err(); err != nil {
			return redisfail.Wrap(err)
		}
		pipe := c.Pipeline()
		for k := range slices.Chunk(keys, 2) { // a value key and its lock share a slot
			pipe.Del(ctx, k...)
		}
		_, err := pipe.Exec(ctx)
		return redisfail.Wrap(err)
	})
}

// eachMaster runs fn on every master of a cluster or ring, or on rdb.
func eachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c redis.Cmdable) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	}
	return fn(ctx, rdb)
}

// restarts notices that Redis restarted or failed over: the run ids of
// its masters changed since the Guard last looked.
type restarts struct {
	mu       sync.Mutex  // guards runID
	runID    string      // the masters' run ids, sorted and joined ("": not read yet)
	checking atomic.Bool // a check after an outage runs (see recovered)
}

// recovered is told that reads succeed again after failing: the Guard
// looks, in the background, whether Redis restarted meanwhile.
func (g *Guard) recovered() {
	select {
	case g.unw.wake <- struct{}{}:
	default: // a wake-up is pending
	}
	if !g.restarts.checking.CompareAndSwap(false, true) {
		return
	}
	g.retry(func() bool {
		ctx, cancel := context.WithTimeout(g.bg.ctx, g.opts.Tuning.RedisTimeout)
		defer cancel()
		g.checkRestart(ctx)
		return true
	}, func() { g.restarts.checking.Store(false) }, nil)
}

// checkRestart reads the masters' run ids and compares them with the last
// ones read. A change is logged once, and makes the filter be rebuilt from
// Filter.IDs (a dump or a promoted replica may lack recent Adds). An ACL
// without INFO leaves it unknown. It runs after connecting, after an
// outage ends and after a replay.
func (g *Guard) checkRestart(ctx context.Context) {
	var mu sync.Mutex
	var ids []string
	err := eachMaster(ctx, g.rdb, func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		}
		return nil
	})
	if err != nil || len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	now := strings.Join(ids, ",")
	r := &g.restarts
	r.mu.Lock()
	was := r.runID
	r.runID = now
	r.mu.Unlock()
	if was == "" || was == now {
		return
	}
	g.stats.restarts.Add(1)
	g.log.Warn("cacheguard: redis restarted or failed over (its run id changed); failed writes are replayed, the filter rebuilt",
		"filter_ids", g.opts.Filter.IDs != nil)
	g.bf.stale.Store(true)
	g.autoRebuild()
}

var errUnwritten = fmt.Errorf("%w: this ID's last write did not reach redis and is not replayed yet", ErrUnavailable)
