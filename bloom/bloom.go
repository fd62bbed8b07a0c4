// Package bloom is a bloom filter kept in Redis bitmaps, shared by every
// process that opens it.
//
// A filter is sized from the number of items it should hold and the false-
// positive rate wanted (m = ⌈−n·ln p / ln²2⌉ bits, k = round(m/n·ln 2) probes;
// 1% costs 9.59 bits and 7 probes per item). An item's k bit positions come
// from one pair of 64-bit xxhash values by enhanced double hashing, all in one
// shard chosen by the hash, so testing or adding an item is one BITFIELD_RO or
// BITFIELD command. Shards are separate keys of at most MaxShardBytes (Redis
// strings stop at 2^32 bits, and a first far write allocates and blocks), with
// no hash tag, so on Redis Cluster they spread over the nodes.
//
// The configuration (m, k, shards, hash) lives in a meta hash beside the
// bitmaps. Open creates it if absent and otherwise compares: a client sized
// differently gets ErrMismatch instead of silently probing other bits.
//
// Bit 0 of every shard is a readiness bit, read by every probe in the same
// command. It is set only when a Rebuild has put every existing ID into the
// filter. Until then, and after Redis loses the shard (restart without
// persistence, eviction, FLUSHDB), probes return ErrNotReady rather than a
// wrong "absent": callers must treat the filter as unavailable and fail open.
package bloom

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"iter"
	"math"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotReady means the filter cannot answer "absent" yet: it was never
	// rebuilt, or Redis lost its bitmap. Callers must fail open.
	ErrNotReady = errors.New("bloom: filter not ready")
	// ErrMismatch means the filter in Redis was created with other sizing.
	ErrMismatch = errors.New("bloom: configuration differs from the filter in Redis")
	// ErrInvalid reports bad options or an empty key.
	ErrInvalid = errors.New("bloom: invalid argument")
)

const (
	// DefaultMaxShardBytes is the default size limit of one bitmap key.
	DefaultMaxShardBytes = 64 << 20
	// maxShardBits is Redis's limit on a string's bit offset (512 MiB), less
	// the readiness bit.
	maxShardBits = 1<<32 - 1
	hashName     = "xxh64x2"
	formatV1     = "1"
	seed2        = 0x9e3779b97f4a7c15 // seed of the second hash
)

//go:embed lua/create_meta.lua
var createMetaLua string

var createMeta = redis.NewScript(createMetaLua)

// Options sizes a filter. A nil *Options means all defaults.
type Options struct {
	// ExpectedItems is the number of items the filter is sized for.
	// Default 1,000,000.
	ExpectedItems uint64
	// FalsePositiveRate is the target rate at ExpectedItems, in (0, 0.5].
	// Default 0.01.
	FalsePositiveRate float64
	// MaxShardBytes caps one bitmap key. Default 64 MiB; at most 512 MiB.
	MaxShardBytes uint64
}

// Config is a filter's layout as stored in Redis.
type Config struct {
	Bits      uint64 // m: total bits (Shards × ShardBits)
	Hashes    int    // k: probes per item
	Shards    int    // number of bitmap keys
	ShardBits uint64 // bits per shard, excluding the readiness bit
}

// Size returns the bits and probes for n items at false-positive rate p.
func Size(n uint64, p float64) (m uint64, k int) {
	m = uint64(math.Ceil(-float64(n) * math.Log(p) / (math.Ln2 * math.Ln2)))
	k = int(math.Round(float64(m) / float64(n) * math.Ln2))
	return max(m, 1), max(k, 1)
}

// Filter is an open bloom filter. It is safe for concurrent use.
type Filter struct {
	rdb       redis.UniversalClient
	cfg       Config
	metaKey   string
	shardKeys []string
}

// Open opens the filter stored under key, creating it if it does not exist.
// Keys used: "<key>:meta" and "<key>:<generation>:<shard>"; key must not
// contain braces (hash tags are the filter's business).
func Open(ctx context.Context, rdb redis.UniversalClient, key string, opts *Options) (*Filter, error) {
	cfg, err := configFor(opts)
	if err != nil {
		return nil, err
	}
	if key == "" || strings.ContainsAny(key, "{}") {
		return nil, fmt.Errorf("%w: key %q must be non-empty and brace-free", ErrInvalid, key)
	}
	f := &Filter{rdb: rdb, cfg: cfg, metaKey: key + ":meta"}
	fields := cfg.fields()
	res, err := createMeta.Run(ctx, rdb, []string{f.metaKey}, fields...).Slice()
	if err != nil {
		return nil, fmt.Errorf("bloom: open %s: %w", key, err)
	}
	stored, err := parseMeta(res)
	if err != nil {
		return nil, fmt.Errorf("bloom: open %s: %w", key, err)
	}
	for i := 0; i < len(fields); i += 2 {
		name, want := fields[i].(string), fields[i+1].(string)
		if stored[name] != want {
			return nil, fmt.Errorf("%w: %s: %s is %q in Redis, %q here", ErrMismatch, key, name, stored[name], want)
		}
	}
	f.shardKeys = make([]string, cfg.Shards)
	for i := range f.shardKeys {
		f.shardKeys[i] = key + ":" + stored["gen"] + ":" + strconv.Itoa(i)
	}
	if res[0].(int64) == 1 {
		// We created the filter: allocate every shard now, with the readiness
		// bit clear, so that no later write has to grow a string while
		// Redis blocks.
		pipe := rdb.Pipeline()
		for _, sk := range f.shardKeys {
			pipe.Process(ctx, redis.NewIntSliceCmd(ctx, "BITFIELD", sk, "SET", "u1", cfg.ShardBits, 0))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("bloom: allocate %s: %w", key, err)
		}
	}
	return f, nil
}

func configFor(opts *Options) (Config, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.ExpectedItems == 0 {
		o.ExpectedItems = 1_000_000
	}
	if o.FalsePositiveRate == 0 {
		o.FalsePositiveRate = 0.01
	}
	if o.MaxShardBytes == 0 {
		o.MaxShardBytes = DefaultMaxShardBytes
	}
	if !(o.FalsePositiveRate > 0 && o.FalsePositiveRate <= 0.5) {
		return Config{}, fmt.Errorf("%w: FalsePositiveRate %v not in (0, 0.5]", ErrInvalid, o.FalsePositiveRate)
	}
	if o.MaxShardBytes < 1024 || o.MaxShardBytes*8 > maxShardBits+1 {
		return Config{}, fmt.Errorf("%w: MaxShardBytes %d not in [1 KiB, 512 MiB]", ErrInvalid, o.MaxShardBytes)
	}
	m, k := Size(o.ExpectedItems, o.FalsePositiveRate)
	limit := min(o.MaxShardBytes*8, maxShardBits)
	shards := (m + limit - 1) / limit
	if shards > 1<<16 {
		return Config{}, fmt.Errorf("%w: %d items need %d shards", ErrInvalid, o.ExpectedItems, shards)
	}
	shardBits := (m + shards - 1) / shards
	return Config{Bits: shards * shardBits, Hashes: k, Shards: int(shards), ShardBits: shardBits}, nil
}

func (c Config) fields() []any {
	return []any{
		"format", formatV1,
		"hash", hashName,
		"bits", strconv.FormatUint(c.Bits, 10),
		"hashes", strconv.Itoa(c.Hashes),
		"shards", strconv.Itoa(c.Shards),
		"shard_bits", strconv.FormatUint(c.ShardBits, 10),
		"gen", "1",
	}
}

func parseMeta(res []any) (map[string]string, error) {
	if len(res) != 2 {
		return nil, fmt.Errorf("unexpected meta reply %v", res)
	}
	flat, ok := res[1].([]any)
	if !ok {
		// RESP3 returns HGETALL as a map.
		if m, ok := res[1].(map[any]any); ok {
			out := make(map[string]string, len(m))
			for k, v := range m {
				out[fmt.Sprint(k)] = fmt.Sprint(v)
			}
			return out, nil
		}
		return nil, fmt.Errorf("unexpected meta reply %T", res[1])
	}
	out := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		out[fmt.Sprint(flat[i])] = fmt.Sprint(flat[i+1])
	}
	return out, nil
}

// Config returns the filter's layout.
func (f *Filter) Config() Config { return f.cfg }

// locate returns the shard and the k bit offsets (1-based: bit 0 is the
// readiness bit) of id, appended to offs.
func (f *Filter) locate(id string, offs []uint64) (int, []uint64) {
	h1 := xxhash.Sum64String(id)
	var d xxhash.Digest
	d.ResetWithSeed(seed2)
	_, _ = d.WriteString(id)
	h2 := d.Sum64()
	shard := int((h2 >> 32) * uint64(f.cfg.Shards) >> 32)
	// Enhanced double hashing (Dillinger & Manolios): x += y; y += i avoids
	// the short cycles of plain h1 + i·h2.
	x, y := h1, h2
	for i := range f.cfg.Hashes {
		offs = append(offs, 1+x%f.cfg.ShardBits)
		x += y
		y += uint64(i)
	}
	return shard, offs
}

// Probe is a test queued in a pipeline; read it after the pipeline ran.
type Probe struct{ cmd *redis.IntSliceCmd }

// Queue adds a test of id to pipe as one BITFIELD_RO command, so that a caller
// can send it in the same round trip as its own commands.
func (f *Filter) Queue(ctx context.Context, pipe redis.Pipeliner, id string) Probe {
	cmd := f.testCmd(ctx, id)
	_ = pipe.Process(ctx, cmd)
	return Probe{cmd}
}

// Result reports whether the item may be present. It returns ErrNotReady when
// the filter cannot answer, and Redis errors wrapped.
func (p Probe) Result() (bool, error) {
	bits, err := p.cmd.Result()
	if err != nil {
		return false, fmt.Errorf("bloom: test: %w", err)
	}
	if len(bits) == 0 || bits[0] == 0 {
		return false, ErrNotReady
	}
	for _, b := range bits[1:] {
		if b == 0 {
			return false, nil
		}
	}
	return true, nil
}

func (f *Filter) testCmd(ctx context.Context, id string) *redis.IntSliceCmd {
	var buf [16]uint64
	shard, offs := f.locate(id, buf[:0])
	args := make([]any, 0, 2+3*(len(offs)+1))
	args = append(args, "BITFIELD_RO", f.shardKeys[shard], "GET", "u1", 0)
	for _, o := range offs {
		args = append(args, "GET", "u1", o)
	}
	return redis.NewIntSliceCmd(ctx, args...)
}

// Test reports whether id may be in the set (false: definitely not). It is
// one BITFIELD_RO command.
func (f *Filter) Test(ctx context.Context, id string) (bool, error) {
	cmd := f.testCmd(ctx, id)
	_ = f.rdb.Process(ctx, cmd)
	return Probe{cmd}.Result()
}

// TestMany tests several ids: one BITFIELD_RO per shard touched, pipelined.
// The result is in the order of ids. ErrNotReady if any touched shard is not
// ready.
func (f *Filter) TestMany(ctx context.Context, ids []string) ([]bool, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	groups := f.group(ids)
	pipe := f.rdb.Pipeline()
	cmds := make(map[int]*redis.IntSliceCmd, len(groups))
	for shard, g := range groups {
		args := make([]any, 0, 5+3*len(g.offs))
		args = append(args, "BITFIELD_RO", f.shardKeys[shard], "GET", "u1", 0)
		for _, o := range g.offs {
			args = append(args, "GET", "u1", o)
		}
		cmds[shard] = redis.NewIntSliceCmd(ctx, args...)
		_ = pipe.Process(ctx, cmds[shard])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("bloom: test: %w", err)
	}
	out := make([]bool, len(ids))
	k := f.cfg.Hashes
	for shard, g := range groups {
		bits := cmds[shard].Val()
		if len(bits) != 1+len(g.offs) {
			return nil, fmt.Errorf("bloom: test: short reply (%d of %d)", len(bits), 1+len(g.offs))
		}
		if bits[0] == 0 {
			return nil, ErrNotReady
		}
		bits = bits[1:]
		for j, idx := range g.items {
			present := true
			for _, b := range bits[j*k : (j+1)*k] {
				if b == 0 {
					present = false
					break
				}
			}
			out[idx] = present
		}
	}
	return out, nil
}

type shardGroup struct {
	items []int    // indexes into ids
	offs  []uint64 // k offsets per item, in items order
}

func (f *Filter) group(ids []string) map[int]*shardGroup {
	groups := make(map[int]*shardGroup, min(f.cfg.Shards, len(ids)))
	var buf [16]uint64
	for i, id := range ids {
		shard, offs := f.locate(id, buf[:0])
		g := groups[shard]
		if g == nil {
			g = &shardGroup{}
			groups[shard] = g
		}
		g.items = append(g.items, i)
		g.offs = append(g.offs, offs...)
	}
	return groups
}

// Add puts id into the filter: one BITFIELD command.
func (f *Filter) Add(ctx context.Context, id string) error { return f.AddMany(ctx, []string{id}) }

// AddMany puts ids into the filter: one BITFIELD command per shard touched,
// pipelined. It does not make a filter ready (see Rebuild).
func (f *Filter) AddMany(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	groups := f.group(ids)
	cmds := make([]redis.Cmder, 0, len(groups))
	for shard, g := range groups {
		args := make([]any, 0, 2+4*len(g.offs))
		args = append(args, "BITFIELD", f.shardKeys[shard])
		for _, o := range g.offs {
			args = append(args, "SET", "u1", o, 1)
		}
		cmds = append(cmds, redis.NewIntSliceCmd(ctx, args...))
	}
	if err := f.run(ctx, cmds); err != nil {
		return fmt.Errorf("bloom: add: %w", err)
	}
	return nil
}

// run sends cmds as one command or one pipeline.
func (f *Filter) run(ctx context.Context, cmds []redis.Cmder) error {
	if len(cmds) == 1 {
		return f.rdb.Process(ctx, cmds[0])
	}
	pipe := f.rdb.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// RebuildOptions tunes Rebuild. A nil *RebuildOptions means defaults.
type RebuildOptions struct {
	// BatchSize is the number of IDs sent per AddMany. Default 1000.
	BatchSize int
	// Progress, if set, is called after each batch with the IDs done so far.
	Progress func(done int)
}

// Rebuild adds every ID from the source of truth and then marks the filter
// ready, so that it may answer "absent" from then on. An error from ids stops
// the rebuild and leaves the readiness unchanged.
func (f *Filter) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *RebuildOptions) (int, error) {
	batch := 1000
	var progress func(int)
	if opts != nil {
		if opts.BatchSize > 0 {
			batch = opts.BatchSize
		}
		progress = opts.Progress
	}
	buf := make([]string, 0, batch)
	done := 0
	flush := func() error {
		if err := f.AddMany(ctx, buf); err != nil {
			return err
		}
		done += len(buf)
		buf = buf[:0]
		if progress != nil {
			progress(done)
		}
		return nil
	}
	for id, err := range ids {
		if err != nil {
			return done, fmt.Errorf("bloom: rebuild: source: %w", err)
		}
		if buf = append(buf, id); len(buf) == batch {
			if err := flush(); err != nil {
				return done, err
			}
		}
	}
	if len(buf) > 0 {
		if err := flush(); err != nil {
			return done, err
		}
	}
	cmds := make([]redis.Cmder, len(f.shardKeys))
	for i, sk := range f.shardKeys {
		cmds[i] = redis.NewIntSliceCmd(ctx, "BITFIELD", sk, "SET", "u1", 0, 1)
	}
	if err := f.run(ctx, cmds); err != nil {
		return done, fmt.Errorf("bloom: rebuild: mark ready: %w", err)
	}
	return done, nil
}
