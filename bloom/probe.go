package bloom

import (
	"context"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// locate returns the shard of id, the byte offset of its block in that
// shard, and its k bit offsets in the shard (appended to offs).
func locate(cfg *Config, id string, offs []uint64) (shard int, blockByte uint64, _ []uint64) {
	h1 := xxhash.Sum64String(id)
	var d xxhash.Digest
	d.ResetWithSeed(seed2)
	_, _ = d.WriteString(id)
	h2 := d.Sum64()
	perShard := cfg.ShardBits / blockBits
	block := (h2 >> 32) * (perShard * uint64(cfg.Shards)) >> 32
	shard, inShard := int(block/perShard), block%perShard
	base := inShard * blockBits
	// Enhanced double hashing (Dillinger & Manolios) inside the block:
	// x += y; y += i avoids the short cycles of plain h1 + i·h2.
	x, y := h1, h2
	for i := range cfg.Hashes {
		offs = append(offs, base+1+x%usableBits)
		x += y
		y += uint64(i)
	}
	return shard, inShard * blockBytes, offs
}

// Probe is a test queued in a pipeline; read it with Result after the
// pipeline ran.
type Probe struct {
	f   *Filter
	id  string
	l   *layout
	cmd *redis.StringCmd
	bit blockBitsOf // the item's bits inside its block
}

// blockBitsOf lists an item's k bit positions inside its block.
type blockBitsOf struct {
	pos [16]uint16
	n   uint8
}

// probe builds the GETRANGE of id's block in layout l.
func probe(ctx context.Context, l *layout, id string) (*redis.StringCmd, blockBitsOf) {
	var buf [16]uint64
	shard, at, offs := locate(&l.cfg, id, buf[:0])
	var b blockBitsOf
	for i, o := range offs {
		b.pos[i] = uint16(o % blockBits)
	}
	b.n = uint8(len(offs))
	return redis.NewStringCmd(ctx, "getrange", l.keys[shard], at, at+blockBytes-1), b
}

// Queue adds a test of id to pipe as one GETRANGE command, so that a caller
// can send it in the same round trip as its own commands.
func (f *Filter) Queue(ctx context.Context, pipe redis.Pipeliner, id string) Probe {
	l := f.cur.Load()
	cmd, b := probe(ctx, l, id)
	_ = pipe.Process(ctx, cmd)
	return Probe{f: f, id: id, l: l, cmd: cmd, bit: b}
}

// Result reports whether the item may be present. If its block was missing
// or not ready, it tests again on the generation another process switched
// to meanwhile, if any (follow: a meta read, one more round trip).
// ErrNotReady when the filter cannot answer; Redis errors wrapped.
func (p Probe) Result(ctx context.Context) (bool, error) {
	maybe, err := verdict(p.cmd, p.bit)
	if !errors.Is(err, ErrNotReady) {
		return maybe, err
	}
	if l := p.f.follow(ctx, p.l, errors.Is(err, errGone)); l != nil {
		cmd, b := probe(ctx, l, p.id)
		_ = p.f.rdb.Process(ctx, cmd)
		if maybe, err = verdict(cmd, b); !errors.Is(err, ErrNotReady) {
			return maybe, err
		}
	}
	return false, ErrNotReady
}

// errGone is ErrNotReady for a block that is missing, not merely unready:
// its shard was dropped (a switch) or lost.
var errGone = fmt.Errorf("%w: shard missing", ErrNotReady)

func verdict(cmd *redis.StringCmd, b blockBitsOf) (bool, error) {
	block, err := cmd.Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("bloom: test: %w", redisfail.Wrap(err))
	}
	// A missing shard reads as an empty string.
	if len(block) < blockBytes {
		return false, errGone
	}
	if block[0]&0x80 == 0 {
		return false, ErrNotReady
	}
	for _, pos := range b.pos[:b.n] { // Redis bit order: most significant bit first
		if block[pos/8]&(0x80>>(pos%8)) == 0 {
			return false, nil
		}
	}
	return true, nil
}

// Test reports whether id may be in the set (false: definitely not). It is
// one GETRANGE command.
func (f *Filter) Test(ctx context.Context, id string) (bool, error) {
	l := f.cur.Load()
	cmd, b := probe(ctx, l, id)
	_ = f.rdb.Process(ctx, cmd)
	return Probe{f: f, id: id, l: l, cmd: cmd, bit: b}.Result(ctx)
}

// TestMany tests several ids: one GETRANGE each, pipelined.
// The result is in the order of ids. ErrNotReady if any touched shard is not
// ready.
func (f *Filter) TestMany(ctx context.Context, ids []string) ([]bool, error) {
	l := f.cur.Load()
	out, err := testMany(ctx, f.rdb, l, ids)
	if errors.Is(err, ErrNotReady) {
		if l = f.follow(ctx, l, errors.Is(err, errGone)); l != nil {
			out, err = testMany(ctx, f.rdb, l, ids)
		}
	}
	if errors.Is(err, errGone) {
		err = ErrNotReady
	}
	return out, err
}

func testMany(ctx context.Context, rdb redis.UniversalClient, l *layout, ids []string) ([]bool, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	bits := make([]blockBitsOf, len(ids))
	for i, id := range ids {
		cmds[i], bits[i] = probe(ctx, l, id)
		_ = pipe.Process(ctx, cmds[i])
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("bloom: test: %w", redisfail.Wrap(err))
	}
	out := make([]bool, len(ids))
	var notReady error
	for i := range ids {
		ok, err := verdict(cmds[i], bits[i])
		switch {
		case errors.Is(err, errGone):
			return nil, err // a switch, or a loss: follow tells which
		case errors.Is(err, ErrNotReady):
			notReady = err
		case err != nil:
			return nil, err
		}
		out[i] = ok
	}
	if notReady != nil {
		return nil, notReady
	}
	return out, nil
}

// offsetsByShard groups the bit offsets of ids by shard, for AddMany.
func offsetsByShard(cfg *Config, ids []string) map[int][]uint64 {
	groups := make(map[int][]uint64, min(cfg.Shards, len(ids)))
	var buf [16]uint64
	for _, id := range ids {
		shard, _, offs := locate(cfg, id, buf[:0])
		groups[shard] = append(groups[shard], offs...)
	}
	return groups
}
