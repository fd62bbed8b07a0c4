package guard

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Add registers newly created IDs in the bloom filter. Call it after the
// source of truth has committed them, before they are read: one round trip
// (two while a rebuild runs; see bloom.Filter.AddMany). Malformed IDs make
// Add fail before any Redis command; Redis failures wrap ErrUnavailable.
func (g *Guard) Add(ctx context.Context, ids ...string) error {
	if err := g.gate.enter(); err != nil {
		return err
	}
	defer g.gate.leave()
	for _, id := range ids {
		if err := g.keys.Check(id); err != nil {
			return err
		}
	}
	return g.fail(ctx, "add", "", g.bloom.AddMany(ctx, ids))
}

// Invalidate drops the cached values and empty markers of ids, so the next
// Get loads them again. Call it after the source of truth has changed them.
//
// It also deletes each ID's fence, so a load that read the old data before
// the change and is still running cannot write it afterwards: its fenced
// write is refused and it loads again. New callers in this process start a
// new flight instead of joining one that may have read the old data, and
// every process's in-memory copy (Options.Local) is dropped. One round trip.
func (g *Guard) Invalidate(ctx context.Context, ids ...string) error {
	if err := g.gate.enter(); err != nil {
		return err
	}
	defer g.gate.leave()
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		k, err := g.keys.Value(id)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil
	}
	// One DEL per ID (value and fence share a slot; IDs do not), and a
	// message per ID for the processes that keep values in memory (Local),
	// in one round trip.
	pipe := g.rdb.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, k, keyspace.Fence(k))
		pipe.Publish(ctx, g.keys.Invalidated(), k)
	}
	_, err := pipe.Exec(ctx)
	for _, k := range keys {
		g.flights.Forget(k)
		if g.local != nil {
			g.local.epoch.Add(1)
			g.local.drop(k)
		}
	}
	return g.fail(ctx, "invalidate", "", redisfail.Wrap(err))
}

// Rebuild replaces the bloom filter with one built from every existing ID of
// the source of truth, and lets it answer "absent". Run it when a Guard is
// first deployed, when Redis has lost the filter (or set RebuildFrom), now and
// then to clear the bits of deleted IDs, and to resize it. Until the first
// Rebuild, Get fails open (counted in Stats.BloomBypasses). No existing ID is
// reported absent at any moment of a rebuild (see package bloom). opts may be
// nil.
func (g *Guard) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *bloom.RebuildOptions) (int, error) {
	if err := g.gate.enter(); err != nil {
		return 0, err
	}
	defer g.gate.leave()
	n, err := g.bloom.Rebuild(ctx, ids, opts)
	return n, g.fail(ctx, "rebuild", "", err)
}

// Info describes the Guard's bloom filter as it is in Redis (see bloom.Info;
// it counts bits, so keep it off the request path).
func (g *Guard) Info(ctx context.Context) (bloom.Info, error) {
	if err := g.gate.enter(); err != nil {
		return bloom.Info{}, err
	}
	defer g.gate.leave()
	in, err := g.bloom.Info(ctx)
	return in, g.fail(ctx, "info", "", err)
}

// autoRebuild starts a background Rebuild from RebuildFrom, at most once a
// minute per process. It is called from inside the gate, so Close (which
// shuts the gate before it waits for rebuilds) cannot miss one.
func (g *Guard) autoRebuild() {
	if g.opts.RebuildFrom == nil {
		return
	}
	now, last := time.Now().UnixNano(), g.lastRebuild.Load()
	if (last != 0 && now-last < int64(time.Minute)) || !g.lastRebuild.CompareAndSwap(last, now) {
		return
	}
	g.rebuilds.Add(1)
	go func() {
		defer g.rebuilds.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		defer close(done)
		go func() { // ends with the rebuild, or cancels it on Close
			select {
			case <-g.closing:
				cancel()
			case <-done:
			}
		}()
		n, err := g.bloom.Rebuild(ctx, g.opts.RebuildFrom(ctx), nil)
		switch {
		case errors.Is(err, bloom.ErrRebuilding):
			g.log.Info("cacheguard: bloom filter is being rebuilt by another process")
		case err != nil:
			g.log.Error("cacheguard: automatic bloom rebuild failed", "err", g.fail(ctx, "rebuild", "", err))
		default:
			g.log.Info("cacheguard: bloom filter rebuilt", "ids", n)
		}
	}()
}
