package aside

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

var (
	//go:embed lua/clear_markers.lua
	clearMarkersLua string
	//go:embed lua/replace.lua
	replaceLua   string
	clearMarkers = redis.NewScript(clearMarkersLua)
	replace      = redis.NewScript(replaceLua)
)

// Add is guard.Guard.Add (documented there).
func (g *Engine) Add(ctx context.Context, ids ...string) error {
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		f, err := g.filter(ctx)
		if err != nil {
			return err
		}
		pipe := g.rdb.Pipeline()
		added := f.QueueAdd(ctx, pipe, ids)
		cleared := make([]*redis.Cmd, len(keys))
		marker := codec.Empty()
		for i, k := range keys {
			cleared[i] = clearMarkers.Eval(ctx, pipe, voids(k), marker)
		}
		marks := g.queueMarks(ctx, pipe, ids, keys)
		_, _ = pipe.Exec(ctx) // errors are read per command
		g.landed(ctx, marks)
		g.forget(keys, nil, time.Time{})
		return g.fail(ctx, "add", one(ids), firstErr(added.Result(ctx), cleared))
	})
}

// Set is guard.Set (documented there).
func Set[T any](ctx context.Context, g *Engine, id string, v T) error {
	pass, err := g.sup.enter()
	if err != nil {
		return err
	}
	defer g.sup.leave(pass)
	if err := Bind[T](g); err != nil {
		return err
	}
	vkey, err := g.keys.Value(id)
	if err != nil {
		return err
	}
	frame, ttl, err := g.valueFrame(v)
	if err != nil {
		return fmt.Errorf("cacheguard: %s %q: %w", g.name, id, err)
	}
	rctx, cancel := g.bounded(ctx)
	defer cancel()
	err = g.replace(rctx, "set", []string{id}, []string{id}, []string{vkey}, frame, func() time.Duration { return ttl },
		&localEntry{frame: frame, value: kept(g, v), life: ttl})
	return g.unwrittenAfter(ctx, []string{id}, err)
}

// Delete is guard.Guard.Delete (documented there).
func (g *Engine) Delete(ctx context.Context, ids ...string) error {
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		return g.replace(ctx, "delete", nil, ids, keys, codec.Empty(), func() time.Duration { return g.jitter(g.opts.EmptyTTL) }, nil)
	})
}

// replace runs replace.lua for each key (of ids) with frame (for ttl(),
// called per key), registers add in the filter, and tells the in-memory
// copies, in one round trip; this process keeps localCopy (nil: none).
func (g *Engine) replace(ctx context.Context, op string, add, ids, keys []string, frame []byte, ttl func() time.Duration,
	localCopy *localEntry) error {
	pipe := g.rdb.Pipeline()
	var added *bloom.PendingAdd
	if len(add) > 0 {
		f, err := g.filter(ctx)
		if err != nil {
			return err
		}
		added = f.QueueAdd(ctx, pipe, add)
	}
	cmds := make([]*redis.Cmd, len(keys))
	var sent time.Time // before the write: its TTL counts from later (see local.put)
	if localCopy != nil {
		sent = time.Now()
	}
	marker := "0" // a value: the writer's version alone
	if len(frame) == 1 && frame[0] == codec.KindEmpty {
		marker = "1" // every version's entry becomes the marker
	}
	for i, k := range keys {
		cmds[i] = replace.Eval(ctx, pipe, voids(k), g.field(), frame, ttl().Milliseconds(), marker, keyspace.Filled)
		pipe.Publish(ctx, g.keys.Invalidated(), k)
	}
	marks := g.queueMarks(ctx, pipe, ids, keys)
	_, _ = pipe.Exec(ctx) // errors are read per command
	g.landed(ctx, marks)
	g.forget(keys, localCopy, sent)
	var err error
	if added != nil {
		err = added.Result(ctx)
	}
	return g.fail(ctx, op, one(ids), firstErr(err, cmds))
}

// forget makes this process's next Gets of keys start afresh: no new caller
// joins a flight that may have read older data, and the in-memory copies
// are dropped (or replaced by copy) under a new epoch, so that a read made
// before the write cannot store its copy after it.
func (g *Engine) forget(keys []string, copy *localEntry, sent time.Time) {
	for _, k := range keys {
		g.flights.Forget(k)
		if g.local != nil {
			g.rd.shared.Forget(k)
			g.local.epoch.Add(1)
			if id, ok := g.keys.ID(k); ok {
				g.local.drop(id)
				if copy != nil {
					g.local.put(id, copy.frame, copy.value, copy.life, sent, g.local.epoch.Load())
				}
			}
		}
	}
}

// write runs a write of ids inside the gate, with their value keys (none:
// nothing to do; a malformed ID: ErrInvalidKey before any Redis command),
// under bounded(ctx): a write that runs out is remembered and replayed.
func (g *Engine) write(ctx context.Context, ids []string, fn func(ctx context.Context, keys []string) error) error {
	pass, err := g.sup.enter()
	if err != nil {
		return err
	}
	defer g.sup.leave(pass)
	keys, err := g.valueKeys(ids)
	if err != nil || len(keys) == 0 {
		return err
	}
	rctx, cancel := g.bounded(ctx)
	defer cancel()
	return g.unwrittenAfter(ctx, ids, fn(rctx, keys))
}

// valueKeys returns the value keys of ids, or ErrInvalidKey before any Redis
// command.
func (g *Engine) valueKeys(ids []string) ([]string, error) {
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

// Invalidate is guard.Guard.Invalidate (documented there).
func (g *Engine) Invalidate(ctx context.Context, ids ...string) error {
	return g.write(ctx, ids, func(ctx context.Context, keys []string) error {
		return g.fail(ctx, "invalidate", one(ids), g.invalidate(ctx, ids, keys))
	})
}

// invalidate drops the entries and load locks of ids (keys, their value
// keys) in one round trip: one DEL per ID (value and lock share a slot; IDs
// do not), and a message per ID for the processes that keep values in
// memory (Local).
func (g *Engine) invalidate(ctx context.Context, ids, keys []string) error {
	pipe := g.rdb.Pipeline()
	g.queueInvalidate(ctx, pipe, keys)
	marks := g.queueMarks(ctx, pipe, ids, keys)
	_, err := pipe.Exec(ctx)
	g.landed(ctx, marks)
	g.forget(keys, nil, time.Time{})
	return redisfail.Wrap(err)
}

// InvalidateAll is guard.Guard.InvalidateAll (documented there).
func (g *Engine) InvalidateAll(ctx context.Context) (int, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	n, err := g.invalidateAll(ctx)
	return n, g.fail(ctx, "invalidate all", "", err)
}

// invalidateAll invalidates every ID that has a key in Redis (a value, a
// lock or a waiting mark), on every master, in two SCAN passes: a load that
// read the source before the call holds its lock from before the first
// pass until its write, so the first pass deletes that lock (and the write
// is refused) or the second finds the entry it wrote. It returns how many
// IDs it invalidated.
func (g *Engine) invalidateAll(ctx context.Context) (int, error) {
	var mu sync.Mutex // guards seen and pass: eachMaster runs fn on the masters at once
	seen := make(map[string]struct{})
	for range 2 {
		pass := make(map[string]struct{}) // a value and its lock: one ID
		err := eachMaster(ctx, g.rdb, func(ctx context.Context, c redis.Cmdable) error {
			var ids, keys []string
			flush := func() error {
				err := g.invalidate(ctx, ids, keys)
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

// queueInvalidate queues, for each key, the DEL of its entry and load lock
// and the message that drops in-memory copies in other processes.
func (g *Engine) queueInvalidate(ctx context.Context, pipe redis.Pipeliner, keys []string) {
	for _, k := range keys {
		pipe.Del(ctx, voids(k)...)
		pipe.Publish(ctx, g.keys.Invalidated(), k)
	}
}

// Rebuild is guard.Guard.Rebuild (documented there).
func (g *Engine) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *bloom.RebuildOptions) (int, error) {
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

// Info is guard.Guard.Info.
func (g *Engine) Info(ctx context.Context) (bloom.Info, error) {
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
