package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Writes, each after the source of truth committed: Add, Set, Delete and
// Invalidate change the IDs' entries and registrations in one round trip,
// void the loads in flight (their load locks are deleted, so a load that
// read older data cannot write it), drop or replace the in-memory copies of
// every process, and are replayed when Redis cannot take them (replay.go).
// InvalidateAll and Rebuild act on the whole Guard.

var (
	//go:embed lua/replace.lua
	replaceLua string
	replace    = redis.NewScript(replaceLua)
)

// Add makes newly created IDs servable at once, in every process. Call it
// after the source of truth has committed them. It registers them in the
// bloom filter and drops whatever Redis holds for them (a "not found"
// marker, or the value of a life before a delete whose invalidation has not
// landed yet: an outside delete in the follower's lag, a Delete still to be
// replayed), voiding any load in flight, as Invalidate does. One round trip
// for any number of IDs (two while a filter rebuild runs). Malformed IDs
// fail before any Redis command; Redis failures wrap ErrUnavailable, and
// the write is replayed (Stats.Unwritten).
// Each write waits for Redis at most Tuning.RedisTimeout, whatever ctx.
func (g *Guard) Add(ctx context.Context, ids ...string) error {
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		return g.fail(ctx, "add", one(ids), g.admit(ctx, ids, keys))
	})
}

// admit is Add's and Invalidate's write (and a failed write's replay):
// ids join the filter, and their entries and load locks are dropped.
func (g *Guard) admit(ctx context.Context, ids, keys []string) error {
	f, err := g.filter(ctx)
	if err != nil {
		return err
	}
	return g.invalidate(ctx, f, ids, keys)
}

// Set writes v as the cached value of id: write-through, after the source of
// truth committed it. In one round trip it replaces the ID's entry (all
// schema versions) with v for TTL ± Jitter, registers the ID in the filter,
// and voids every load in flight; every process's in-memory copy is replaced
// here and dropped elsewhere. Of two racing Sets of one ID, the last to
// reach Redis wins: make that the order of their commits (Set under the
// row's lock), or call Invalidate, which never caches what it did not read.
// A Set that cannot reach Redis wraps ErrUnavailable and is replayed (as an
// Invalidate; see Stats.Unwritten).
func Set[T any](ctx context.Context, g *Guard, id string, v T) error {
	if g == nil {
		return errNil("Set")
	}
	ids := []string{id}
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		if err := bind[T](g); err != nil {
			return err
		}
		frame, ttl, err := g.valueFrame(v)
		if err != nil {
			return fmt.Errorf("cacheguard: %s %q: %w", g.name, id, err)
		}
		return g.replace(ctx, ids, keys, change{op: "set", add: ids, copy: &localEntry{frame: frame, value: kept(g, v), life: ttl},
			queue: g.writeFrame(ctx, frame, func() time.Duration { return ttl })})
	})
}

// Delete records that ids no longer exist, after the source of truth deleted
// them: in one round trip each ID's entry (all schema versions) becomes an
// empty marker for EmptyTTL ± Jitter, loads in flight are voided, and every
// process's in-memory copy is dropped: the next Get, in any process, answers
// ErrNotFound without a load, until an Add. A Delete that cannot reach Redis
// wraps ErrUnavailable and is replayed (as an Invalidate).
func (g *Guard) Delete(ctx context.Context, ids ...string) error {
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		return g.replace(ctx, ids, keys, change{op: "delete",
			queue: g.writeFrame(ctx, codec.Empty(), func() time.Duration { return g.jitter(g.opts.EmptyTTL) })})
	})
}

// change is what one write (op) does: queue's command for each key, the
// IDs it registers in the filter (add), and this process's copy of each
// value afterwards (copy; nil: dropped).
type change struct {
	op    string
	add   []string
	copy  *localEntry
	queue func(pipe redis.Pipeliner, key string) *redis.Cmd
}

// replace runs one write's round trip: w's command for each key (of ids),
// whose errors count, the registration of w.add in the filter, and the
// marks of ids. This process's copies are dropped, or replaced by w.copy.
func (g *Guard) replace(ctx context.Context, ids, keys []string, w change) error {
	pipe := g.rdb.Pipeline()
	var added *bloom.PendingAdd
	if len(w.add) > 0 {
		f, err := g.filter(ctx)
		if err != nil {
			return err
		}
		added = f.QueueAdd(ctx, pipe, w.add)
	}
	cmds := make([]*redis.Cmd, len(keys))
	var sent time.Time // before the write: its TTL counts from later (see local.put)
	if w.copy != nil {
		sent = time.Now()
	}
	for i, k := range keys {
		cmds[i] = w.queue(pipe, k)
	}
	marks := g.queueMarks(ctx, pipe, ids, keys)
	_, _ = pipe.Exec(ctx) // errors are read per command
	g.landed(ctx, marks)
	g.forget(keys, w.copy, sent)
	var err error
	if added != nil {
		err = added.Result(ctx)
	}
	return g.fail(ctx, w.op, one(ids), firstErr(err, cmds))
}

// writeFrame queues replace.lua, which makes frame the entry (for ttl(),
// called per key), with the message that drops other processes' copies.
func (g *Guard) writeFrame(ctx context.Context, frame []byte, ttl func() time.Duration) func(redis.Pipeliner, string) *redis.Cmd {
	marker := "0" // a value: the writer's version alone
	if len(frame) == 1 && frame[0] == codec.KindEmpty {
		marker = "1" // every version's entry becomes the marker
	}
	return func(pipe redis.Pipeliner, k string) *redis.Cmd {
		c := replace.Eval(ctx, pipe, voids(k), g.field(), frame, ttl().Milliseconds(), marker, keyspace.Filled)
		pipe.Publish(ctx, g.keys.Invalidated(), k)
		return c
	}
}

// forget makes this process's next Gets of keys start afresh: no new caller
// joins a flight that may have read older data, and the in-memory copies
// are dropped (or replaced by copy) under a new epoch of their stripes, so
// that a read made before the write cannot store its copy after it.
func (g *Guard) forget(keys []string, copy *localEntry, sent time.Time) {
	for _, k := range keys {
		g.flights.Forget(flightKey{vkey: k})
		if g.local != nil {
			g.rd.shared.Forget(k)
			if id, ok := g.keys.ID(k); ok {
				g.local.drop(id)
				if copy != nil {
					g.local.put(id, copy.frame, copy.value, lifetime{ttl: copy.life, sent: sent}, g.local.epoch.Load())
				}
			}
		}
	}
}

// write runs a write of ids inside the gate, with their value keys (none:
// nothing to do; a malformed ID: ErrInvalidKey before any Redis command),
// under bounded(ctx): a write that runs out is remembered and replayed.
func (g *Guard) write(ctx context.Context, ids []string, fn func(ctx context.Context, keys []string) error) error {
	pass, err := g.sup.enter()
	if err != nil {
		return err
	}
	defer g.sup.leave(pass)
	keys, err := g.valueKeys(ids)
	if err != nil || len(keys) == 0 {
		return err
	}
	rctx, cancel := g.bounded(ctx, g.opts.Tuning.RedisTimeout)
	defer cancel()
	return g.unwrittenAfter(ctx, ids, fn(rctx, keys))
}

// valueKeys returns the value keys of ids, or ErrInvalidKey before any Redis
// command.
func (g *Guard) valueKeys(ids []string) ([]string, error) {
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		k, err := g.keys.Value(id)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// firstErr is err, or else the first error of cmds, wrapping ErrUnavailable.
func firstErr(err error, cmds []*redis.Cmd) error {
	if err != nil {
		return err
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return redisfail.Wrap(err)
		}
	}
	return nil
}

// Invalidate drops the cached values and empty markers of ids (all schema
// versions), so the next Get loads them again: call it after the source of
// truth changed them. It deletes each ID's load lock too, so a load that
// read the old data and is still running cannot write it (it loads again);
// new callers in this process start a new flight, and every process's
// in-memory copy is dropped. The IDs join the filter too, as with Add: a
// row changed here exists even if its creation has not reached the filter
// yet (an outside INSERT within the follower's lag), and a deleted one only
// loads once more. One round trip (two while a filter rebuild runs). Redis
// failures wrap ErrUnavailable, and the write is replayed (Stats.Unwritten).
func (g *Guard) Invalidate(ctx context.Context, ids ...string) error {
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		return g.fail(ctx, "invalidate", one(ids), g.admit(ctx, ids, keys))
	})
}

// invalidate drops the entries and load locks of ids (keys, their value
// keys) in one round trip: one DEL per ID (value and lock share a slot; IDs
// do not), and a message per ID for the processes that keep values in
// memory (Local). With f, the IDs join that filter too (Add, a replay).
func (g *Guard) invalidate(ctx context.Context, f *bloom.Filter, ids, keys []string) error {
	pipe := g.rdb.Pipeline()
	var added *bloom.PendingAdd
	if f != nil {
		added = f.QueueAdd(ctx, pipe, ids)
	}
	for _, k := range keys {
		pipe.Del(ctx, voids(k)...)
		pipe.Publish(ctx, g.keys.Invalidated(), k)
	}
	marks := g.queueMarks(ctx, pipe, ids, keys)
	_, err := pipe.Exec(ctx)
	g.landed(ctx, marks)
	g.forget(keys, nil, time.Time{})
	if added != nil { // even after a failure: the filter's copy learns the IDs (PendingAdd.Result)
		if aerr := added.Result(ctx); err == nil {
			err = aerr
		}
	}
	return redisfail.Wrap(err)
}

// InvalidateAll invalidates, as Invalidate does, every ID of the Guard that
// has an entry or a load in flight: after a TRUNCATE or a bulk change that
// no list of IDs describes (two SCAN passes on every master). It returns how
// many IDs it invalidated and leaves the filter as it is (see Rebuild).
// Redis failures wrap ErrUnavailable and are not replayed: call it again.
func (g *Guard) InvalidateAll(ctx context.Context) (int, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	n, err := g.invalidateAll(ctx)
	return n, g.fail(ctx, "invalidate all", "", err)
}

// invalidateAll invalidates every ID that has a key in Redis (a value, a
// lock or a waiting mark) in two SCAN passes: a load that read the source
// before the call holds its lock until its write, so the first pass deletes
// that lock (its write is refused) or the second finds the entry it wrote.
func (g *Guard) invalidateAll(ctx context.Context) (int, error) {
	var mu sync.Mutex // guards seen and pass: eachMaster runs fn on the masters at once
	seen := make(map[string]struct{})
	for range 2 {
		pass := make(map[string]struct{}) // a value and its lock: one ID
		err := eachMaster(ctx, g.rdb, func(ctx context.Context, c redis.Cmdable) error {
			var ids, keys []string
			flush := func() error {
				err := g.invalidate(ctx, nil, ids, keys)
				ids, keys = ids[:0], keys[:0]
				return err
			}
			it := c.Scan(ctx, 0, g.keys.IDKeys(), 1000).Iterator()
			for it.Next(ctx) {
				vkey, ok := g.keys.Owner(it.Val())
				mu.Lock()
				_, dup := pass[vkey]
				id, _ := g.keys.ID(vkey)
				if ok && !dup {
					pass[vkey], seen[id] = struct{}{}, struct{}{}
				}
				mu.Unlock()
				if !ok || dup {
					continue
				}
				if ids, keys = append(ids, id), append(keys, vkey); len(keys) == 500 {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			if err := it.Err(); err != nil {
				return redisfail.Wrap(err)
			}
			if len(keys) == 0 {
				return nil
			}
			return flush()
		})
		if err != nil {
			return len(seen), err
		}
	}
	return len(seen), nil
}

// Rebuild replaces the bloom filter with one built from every existing ID of
// the source of truth, and lets it answer "absent" (until then Get fails
// open). With Options.Filter.IDs the Guard does it by itself whenever the
// filter is not ready; call it to resize the filter, to clear the bits of
// deleted IDs, or without an ID source. No existing ID is reported absent
// meanwhile. It waits for this Guard's automatic rebuild, if one runs; if it
// fails and Filter.IDs is set, the Guard goes on trying. opts may be nil.
func (g *Guard) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *bloom.RebuildOptions) (int, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	f, err := g.filter(ctx)
	if err != nil {
		g.autoRebuild("a Rebuild failed")
		return 0, err
	}
	g.bf.mu.Lock() // after this Guard's automatic rebuild, if one runs
	n, err := f.Rebuild(ctx, ids, opts)
	g.bf.mu.Unlock()
	if err != nil && !errors.Is(err, bloom.ErrRebuilding) {
		g.autoRebuild("a Rebuild failed")
	}
	if err == nil && !g.opts.Filter.NoLocalCopy {
		// The copy follows the new generation before Rebuild returns: no fetch
		// of it lands later among the caller's commands.
		if _, cerr := g.refreshHeld(ctx, true); cerr != nil {
			g.wakeCopy()
		}
	}
	return n, g.fail(ctx, "rebuild", "", err)
}

// Info describes the Guard's bloom filter as it is in Redis (see bloom.Info;
// it counts bits, so keep it off the request path).
func (g *Guard) Info(ctx context.Context) (bloom.Info, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return bloom.Info{}, err
	}
	defer g.sup.leave(pass)
	f, err := g.filter(ctx)
	if err != nil {
		return bloom.Info{}, err
	}
	in, err := f.Info(ctx)
	return in, g.fail(ctx, "info", "", err)
}

// voids is what a write to the source of truth deletes: the value key
// (first, as the scripts take it) and its load lock, which voids the loads
// of vkey in flight (a holder's write checks its token there).
func voids(vkey string) []string {
	return []string{vkey, keyspace.Lock(vkey)}
}
