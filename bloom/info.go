package bloom

import (
	"context"
	"fmt"
	"math"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Info describes the filter as it is in Redis.
type Info struct {
	Generation int64
	Config     Config
	Ready      bool   // every shard's first block has its readiness bit
	Rebuilding bool   // a rebuild has announced the next generation
	Added      uint64 // items loaded by the last rebuild plus items added since (repeats count again)
	BitsSet    uint64 // bits set, readiness bits excluded (BITCOUNT)
	// FillRatio is BitsSet over the usable bits (511 of each 512-bit block);
	// EstimatedItems and EstimatedFPRate derive from it (n ≈ −m/k·ln(1−fill),
	// p ≈ fill^k, which a blocked filter exceeds by a few percent).
	FillRatio       float64
	EstimatedItems  float64
	EstimatedFPRate float64
	MemoryBytes     int64 // MEMORY USAGE of the shards
}

// Info reads the meta and counts the bits of every shard (BITCOUNT is
// O(size): meant for operators and dashboards, not the request path).
func (f *Filter) Info(ctx context.Context) (Info, error) {
	m, err := f.readMeta(ctx)
	if err != nil {
		return Info{}, fmt.Errorf("bloom: info: %w", err)
	}
	l := m.cur
	b, err := f.bitsOf(ctx, l)
	if err != nil {
		return Info{}, fmt.Errorf("bloom: info: %w", err)
	}
	return Info{Generation: l.gen, Config: l.cfg, Ready: b.ready, Rebuilding: m.next != nil, Added: m.added,
		BitsSet: b.set, MemoryBytes: b.memory, FillRatio: b.fill(l.cfg), EstimatedItems: b.items(l.cfg),
		EstimatedFPRate: math.Pow(b.fill(l.cfg), float64(l.cfg.Hashes))}, nil
}

// shardBits is what a generation's shards hold.
type shardBits struct {
	ready  bool   // every shard's first block has its readiness bit
	set    uint64 // bits set, readiness bits excluded
	memory int64  // MEMORY USAGE
}

// fill is the share of the usable bits (511 of each block's 512) set.
func (b shardBits) fill(cfg Config) float64 {
	return float64(b.set) / float64(cfg.Bits/blockBits*usableBits)
}

// items estimates the distinct IDs behind the bits: n ≈ −m/k·ln(1−fill).
func (b shardBits) items(cfg Config) float64 {
	mbits, k := float64(cfg.Bits/blockBits*usableBits), float64(cfg.Hashes)
	return max(0, -mbits/k*math.Log(1-min(b.fill(cfg), 1-1e-12))) // max: no -0
}

// bitsOf counts the bits of l's shards (BITCOUNT is O(size)).
func (f *Filter) bitsOf(ctx context.Context, l *layout) (shardBits, error) {
	pipe := f.rdb.Pipeline()
	counts := make([]*redis.IntCmd, len(l.keys))
	ready := make([]*redis.IntCmd, len(l.keys))
	mem := make([]*redis.IntCmd, len(l.keys))
	for i, k := range l.keys {
		counts[i] = pipe.BitCount(ctx, k, nil)
		ready[i] = pipe.GetBit(ctx, k, 0)
		mem[i] = pipe.MemoryUsage(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // a missing shard answers MEMORY USAGE with nil
	b := shardBits{ready: true}
	for i := range l.keys {
		if err := counts[i].Err(); err != nil {
			return shardBits{}, redisfail.Wrap(err)
		}
		r := ready[i].Val()
		b.ready = b.ready && r == 1
		// A ready shard has every block's readiness bit set.
		b.set += uint64(counts[i].Val() - r*int64(l.cfg.ShardBits/blockBits))
		b.memory += mem[i].Val()
	}
	return b, nil
}

// held is how many IDs generation l holds: the count its rebuild read, or
// what its bits say if they say more (Adds since) and it is ready.
func (f *Filter) held(ctx context.Context, l *layout) (float64, error) {
	b, err := f.bitsOf(ctx, l)
	if err != nil {
		return 0, err
	}
	n := float64(l.loaded)
	if b.ready {
		n = max(n, b.items(l.cfg))
	}
	return n, nil
}
