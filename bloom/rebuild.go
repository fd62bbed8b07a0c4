package bloom

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/bits"
	"strconv"
	"time"

	"github.com/bits-and-blooms/bitset"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/lock"
)

var (
	//go:embed lua/begin_rebuild.lua
	beginRebuildLua string
	//go:embed lua/switch_gen.lua
	switchGenLua string

	beginRebuild = redis.NewScript(beginRebuildLua)
	switchGen    = redis.NewScript(switchGenLua)
)

// RebuildOptions tunes Rebuild. A nil *RebuildOptions means defaults.
type RebuildOptions struct {
	// ExpectedItems and FalsePositiveRate resize the filter; 0 keeps the
	// current generation's sizing. Clients follow the new layout by
	// themselves, and processes started later with the old sizing adopt it
	// (unless Options.Strict); update their options at leisure.
	ExpectedItems     uint64
	FalsePositiveRate float64
	// ChunkBytes is the size of one SETRANGE upload. Default 1 MiB.
	ChunkBytes int
	// Progress, if set, is called as IDs are read (every 100,000) and as
	// bytes are uploaded (every chunk).
	Progress func(RebuildProgress)
}

// RebuildProgress reports how far a Rebuild is.
type RebuildProgress struct {
	IDs           int    // IDs read from the source so far
	BytesUploaded uint64 // bitmap bytes sent to Redis so far
	BytesTotal    uint64 // bitmap bytes to send in all
}

// Rebuild replaces the filter with a new generation built from every ID of
// the source of truth (ids), and makes it ready. It returns the number of IDs
// read. Another process's Rebuild of the same filter makes it fail with
// ErrRebuilding; an error from ids stops it with the current generation
// still in place.
//
// The source must see every ID committed before Rebuild announced the new
// generation (any query that starts after Rebuild was called does); IDs
// committed later reach the new generation through Add, which writes to both
// generations while a rebuild runs.
func (f *Filter) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *RebuildOptions) (int, error) {
	var o RebuildOptions
	if opts != nil {
		o = *opts
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = 1 << 20
	}
	progress := func(p RebuildProgress) {
		if o.Progress != nil {
			o.Progress(p)
		}
	}

	// One rebuild at a time per filter, across processes.
	const leaseTTL = 30 * time.Second
	l, err := lock.New(f.rdb).Obtain(ctx, f.names.RebuildLock(), leaseTTL, nil)
	if errors.Is(err, lock.ErrNotObtained) {
		return 0, ErrRebuilding
	}
	if err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", err)
	}
	stop := l.KeepAlive(ctx, leaseTTL, nil)
	defer func() {
		stop()
		_ = l.Release(context.WithoutCancel(ctx))
	}()

	cur, err := f.reload(ctx)
	if err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", err)
	}
	n, p := cur.cfg.ExpectedItems, cur.cfg.FalsePositiveRate
	if o.ExpectedItems > 0 {
		n = o.ExpectedItems
	}
	if o.FalsePositiveRate > 0 {
		p = o.FalsePositiveRate
	}
	cfg, err := configFor(n, p, f.opts.MaxShardBytes)
	if err != nil {
		return 0, err
	}
	next := &layout{gen: cur.gen + 1, cfg: cfg, keys: shardKeys(f.names, cur.gen+1, cfg.Shards)}

	// Leftovers of a rebuild that died, then fresh, empty shards.
	if err := unlink(ctx, f.rdb, append(next.keys, stagingKeys(next.keys)...)); err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", redisfail.Wrap(err))
	}
	if err := allocate(ctx, f.rdb, next); err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", redisfail.Wrap(err))
	}
	// Announce: from here on Add writes to both generations.
	args := append([]any{strconv.FormatInt(cur.gen, 10), strconv.FormatInt(next.gen, 10)}, cfg.fields("next_")...)
	if ok, err := beginRebuild.Run(ctx, f.rdb, []string{f.names.Meta()}, args...).Int(); err != nil {
		return 0, fmt.Errorf("bloom: rebuild: announce generation %d: %w", next.gen, redisfail.Wrap(err))
	} else if ok != 1 {
		return 0, fmt.Errorf("bloom: rebuild: announce generation %d: generation %d is no longer current", next.gen, cur.gen)
	}

	// Build the bits locally: one bitset per shard, every block's readiness
	// bit set.
	sets := make([]*bitset.BitSet, cfg.Shards)
	for i := range sets {
		sets[i] = bitset.New(uint(cfg.ShardBits))
		for b := uint64(0); b < cfg.ShardBits; b += blockBits {
			sets[i].Set(uint(b))
		}
	}
	count := 0
	var buf [16]uint64
	for id, err := range ids {
		if err != nil {
			return count, fmt.Errorf("bloom: rebuild: source: %w", err)
		}
		shard, _, offs := locate(&cfg, id, buf[:0])
		for _, o := range offs {
			sets[shard].Set(uint(o))
		}
		if count++; count%100_000 == 0 {
			progress(RebuildProgress{IDs: count})
		}
		if count%4096 == 0 && ctx.Err() != nil {
			return count, ctx.Err()
		}
	}

	// A generation that would answer "maybe" far more often than asked is
	// no protection: keep the current one and say how to size it.
	if est := estimatedFPRate(cfg, count); est > 2*cfg.FalsePositiveRate {
		return count, fmt.Errorf("%w: %d IDs in a filter sized for %d give an estimated false-positive rate of %.3g "+
			"(target %g); rebuild with ExpectedItems of at least %d", ErrTooSmall, count, cfg.ExpectedItems, est,
			cfg.FalsePositiveRate, count)
	}

	// Upload into staging keys and OR them into the new shards, which may
	// already hold bits that Add wrote during the build.
	shardBytes := cfg.ShardBits / 8
	p0 := RebuildProgress{IDs: count, BytesTotal: shardBytes * uint64(cfg.Shards)}
	chunk := make([]byte, o.ChunkBytes)
	for i, set := range sets {
		staging := keyspace.Staging(next.keys[i])
		words := set.Words()
		for off := uint64(0); off < shardBytes; off += uint64(len(chunk)) {
			c := chunk[:min(uint64(len(chunk)), shardBytes-off)]
			redisOrder(c, words, off)
			if err := f.rdb.SetRange(ctx, staging, int64(off), string(c)).Err(); err != nil {
				return count, fmt.Errorf("bloom: rebuild: upload: %w", redisfail.Wrap(err))
			}
			p0.BytesUploaded += uint64(len(c))
			progress(p0)
		}
		if err := f.rdb.BitOpOr(ctx, next.keys[i], next.keys[i], staging).Err(); err != nil {
			return count, fmt.Errorf("bloom: rebuild: merge: %w", redisfail.Wrap(err))
		}
		if err := unlink(ctx, f.rdb, []string{staging}); err != nil {
			return count, fmt.Errorf("bloom: rebuild: %w", redisfail.Wrap(err))
		}
		sets[i] = nil // let the memory go
	}

	// Switch. Drop the old generation first: its readers find no block,
	// fail open and re-read the meta, instead of missing IDs that Add now
	// writes only to the new generation (and Add skips a missing shard).
	if err := unlink(ctx, f.rdb, cur.keys); err != nil {
		return count, fmt.Errorf("bloom: rebuild: drop generation %d: %w", cur.gen, redisfail.Wrap(err))
	}
	if ok, err := switchGen.Run(ctx, f.rdb, []string{f.names.Meta()}, strconv.FormatInt(next.gen, 10), count).Int(); err != nil {
		return count, fmt.Errorf("bloom: rebuild: switch to generation %d: %w", next.gen, redisfail.Wrap(err))
	} else if ok != 1 {
		return count, fmt.Errorf("bloom: rebuild: switch to generation %d: it is no longer the announced one", next.gen)
	}
	f.cur.Store(next)
	return count, nil
}

// redisOrder fills c with the bytes of a bitset starting at byte off, in
// Redis's bit order: bit i is byte i/8, most significant bit first, where
// bitset keeps bit i in word i/64, least significant bit first.
func redisOrder(c []byte, words []uint64, off uint64) {
	for j := range c {
		b := off + uint64(j)
		if w := b / 8; w < uint64(len(words)) {
			c[j] = bits.Reverse8(byte(words[w] >> (8 * (b % 8))))
		} else {
			c[j] = 0
		}
	}
}

func stagingKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = keyspace.Staging(k)
	}
	return out
}

// unlink deletes keys without blocking Redis on large values, one command
// per key (they live in different slots).
func unlink(ctx context.Context, rdb redis.UniversalClient, keys []string) error {
	pipe := rdb.Pipeline()
	for _, k := range keys {
		pipe.Unlink(ctx, k)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// estimatedFPRate is the false-positive rate of a filter of cfg holding n
// IDs: (1 − e^(−k·n/m))^k.
func estimatedFPRate(cfg Config, n int) float64 {
	k, m := float64(cfg.Hashes), float64(cfg.Bits)
	return math.Pow(1-math.Exp(-k*float64(n)/m), k)
}
