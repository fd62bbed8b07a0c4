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
	h, err := f.rdb.HGetAll(ctx, f.names.Meta()).Result()
	if err != nil {
		return Info{}, fmt.Errorf("bloom: info: %w", redisfail.Wrap(err))
	}
	m, err := parseMeta(f.names, h)
	if err != nil {
		return Info{}, fmt.Errorf("bloom: info: %w", err)
	}
	l := m.cur
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
	in := Info{Generation: l.gen, Config: l.cfg, Ready: true, Rebuilding: m.next != nil}
	fmt.Sscan(h["added"], &in.Added)
	for i := range l.keys {
		if err := counts[i].Err(); err != nil {
			return Info{}, fmt.Errorf("bloom: info: %w", redisfail.Wrap(err))
		}
		r := ready[i].Val()
		in.Ready = in.Ready && r == 1
		// A ready shard has every block's readiness bit set.
		in.BitsSet += uint64(counts[i].Val() - r*int64(l.cfg.ShardBits/blockBits))
		in.MemoryBytes += mem[i].Val()
	}
	mbits, k := float64(l.cfg.Bits/blockBits*usableBits), float64(l.cfg.Hashes)
	in.FillRatio = float64(in.BitsSet) / mbits
	in.EstimatedItems = -mbits / k * math.Log(1-min(in.FillRatio, 1-1e-12))
	in.EstimatedFPRate = math.Pow(in.FillRatio, k)
	return in, nil
}
