// Package bloom is a bloom filter kept in Redis bitmaps, shared by every
// process that opens it.
//
// A filter is sized from the number of items it should hold and the false-
// positive rate wanted (m = ⌈−n·ln p / ln²2⌉ bits, k = round(m/n·ln 2) probes;
// 1% costs 9.59 bits and 7 probes per item). An item's k bit positions come
// from one pair of 64-bit xxhash values by enhanced double hashing, all in one
// shard chosen by the hash, so testing an item is one BITFIELD_RO command to
// one node. Shards are separate keys of at most MaxShardBytes (Redis strings
// stop at 2^32 bits, and a first far write allocates while Redis blocks),
// each with its own hash tag so they spread over a cluster, and allocated in
// full when they are created.
//
// The layout (m, k, shards, hash, generation) lives in a meta hash. Open
// creates it if absent and otherwise compares: a client sized differently
// gets ErrMismatch instead of silently probing other bits.
//
// Bit 0 of every shard is a readiness bit, read by every probe in the same
// command. Only Rebuild sets it, once every existing ID is in. Until then, and
// whenever Redis has lost the shard (restart without persistence, eviction,
// FLUSHDB), a probe reports ErrNotReady rather than a wrong "absent": callers
// must fail open. The readiness bit also tells a client that its cached
// generation was replaced: it re-reads the meta and probes again.
//
// Rebuild builds the next generation from the source of truth in local
// memory (github.com/bits-and-blooms/bitset), uploads it with SETRANGE into a
// staging key beside each new shard and ORs it in (BITOP, same hash tag), so
// the bits that Add wrote into the new generation meanwhile are kept. Add
// writes into both generations from the moment the rebuild is announced in
// the meta. The switch clears the old generation's readiness bits first (its
// readers fail open for a moment), then makes the new generation current in
// one script, then deletes the old shards: at no moment is an existing ID
// reported absent. A rebuild may also resize the filter.
package bloom

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotReady means the filter cannot answer "absent" now: it was never
	// rebuilt, or Redis lost it. Callers must fail open.
	ErrNotReady = errors.New("bloom: filter not ready")
	// ErrMismatch means the filter in Redis was created with other sizing.
	ErrMismatch = errors.New("bloom: configuration differs from the filter in Redis")
	// ErrInvalid reports bad options or an empty key.
	ErrInvalid = errors.New("bloom: invalid argument")
	// ErrRebuilding means another process is rebuilding the filter.
	ErrRebuilding = errors.New("bloom: a rebuild is already running")
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
	// reloadEvery limits how often a client re-reads the meta after
	// finding a shard not ready: often enough that readers follow a
	// generation switch within a blink, rarely enough that a lost filter
	// costs each process at most ten HGETALLs a second.
	reloadEvery = 100 * time.Millisecond
)

var (
	//go:embed lua/create_meta.lua
	createMetaLua string
	//go:embed lua/set_bits.lua
	setBitsLua string

	createMeta = redis.NewScript(createMetaLua)
	setBits    = redis.NewScript(setBitsLua)
)

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
	// OnSaturated, if set, is called (once per generation and client) when
	// an Add finds that the items added so far push the estimated false-
	// positive rate above the target by more than SaturationMargin: time to
	// Rebuild with a larger ExpectedItems.
	OnSaturated func(Saturation)
	// SaturationMargin is the relative excess that triggers OnSaturated.
	// Default 0.5 (a 1% target fires at 1.5%).
	SaturationMargin float64
}

// Saturation is what OnSaturated is told.
type Saturation struct {
	Generation      int64
	Added           uint64  // items counted into this generation
	EstimatedFPRate float64 // (1 − e^(−k·n/m))^k for n = Added
	TargetFPRate    float64
}

// Config is a filter's layout.
type Config struct {
	Items     uint64  // n the filter was sized for
	FPRate    float64 // p the filter was sized for
	Bits      uint64  // m: total bits (Shards × ShardBits)
	Hashes    int     // k: probes per item
	Shards    int     // number of bitmap keys
	ShardBits uint64  // bits per shard, excluding the readiness bit
}

// Size returns the bits and probes for n items at false-positive rate p.
func Size(n uint64, p float64) (m uint64, k int) {
	m = uint64(math.Ceil(-float64(n) * math.Log(p) / (math.Ln2 * math.Ln2)))
	k = int(math.Round(float64(m) / float64(max(n, 1)) * math.Ln2))
	return max(m, 1), max(k, 1)
}

// layout is one generation of the filter: its sizing and its shard keys.
type layout struct {
	gen  int64
	cfg  Config
	keys []string
}

// Filter is an open bloom filter. It is safe for concurrent use.
type Filter struct {
	rdb           redis.UniversalClient
	base          string
	metaKey       string
	opts          Options // resolved
	maxShardBytes uint64

	cur        atomic.Pointer[layout] // the generation probes use
	lastReload atomic.Int64           // unix nanos of the last meta re-read
	saturated  atomic.Int64           // generation OnSaturated was last called for
}

// Open opens the filter stored under key, creating it if it does not exist.
// Its keys are "<key>:meta" and "{<key>:<generation>:<shard>}"; key must not
// contain braces.
func Open(ctx context.Context, rdb redis.UniversalClient, key string, opts *Options) (*Filter, error) {
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if key == "" || strings.ContainsAny(key, "{}") {
		return nil, fmt.Errorf("%w: key %q must be non-empty and brace-free", ErrInvalid, key)
	}
	f := &Filter{rdb: rdb, base: key, metaKey: key + ":meta", opts: o}
	want, err := configFor(o.ExpectedItems, o.FalsePositiveRate, o.MaxShardBytes)
	if err != nil {
		return nil, err
	}
	m, err := f.openMeta(ctx, want)
	if err != nil {
		return nil, err
	}
	if got := m.cur.cfg; got.Bits != want.Bits || got.Hashes != want.Hashes || got.Shards != want.Shards || got.ShardBits != want.ShardBits {
		return nil, fmt.Errorf("%w: %s holds %d bits, %d hashes, %d shards; these options make %d bits, %d hashes, %d shards",
			ErrMismatch, key, got.Bits, got.Hashes, got.Shards, want.Bits, want.Hashes, want.Shards)
	}
	f.cur.Store(m.cur)
	return f, nil
}

func resolve(opts *Options) (Options, error) {
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
	if o.SaturationMargin <= 0 {
		o.SaturationMargin = 0.5
	}
	if o.MaxShardBytes < 1024 || o.MaxShardBytes*8 > maxShardBits+1 {
		return Options{}, fmt.Errorf("%w: MaxShardBytes %d not in [1 KiB, 512 MiB]", ErrInvalid, o.MaxShardBytes)
	}
	return o, nil
}

func configFor(n uint64, p float64, maxShardBytes uint64) (Config, error) {
	if !(p > 0 && p <= 0.5) {
		return Config{}, fmt.Errorf("%w: FalsePositiveRate %v not in (0, 0.5]", ErrInvalid, p)
	}
	if n == 0 || n > 1<<40 {
		return Config{}, fmt.Errorf("%w: ExpectedItems %d", ErrInvalid, n)
	}
	m, k := Size(n, p)
	limit := min(maxShardBytes*8, maxShardBits)
	shards := (m + limit - 1) / limit
	if shards > 1<<16 {
		return Config{}, fmt.Errorf("%w: %d items need %d shards", ErrInvalid, n, shards)
	}
	shardBits := (m + shards - 1) / shards
	return Config{Items: n, FPRate: p, Bits: shards * shardBits, Hashes: k, Shards: int(shards), ShardBits: shardBits}, nil
}

// shardKeys returns the keys of a generation's shards. Each has a hash tag of
// its own, so shards spread over cluster slots, and a staging key (":up")
// shares its slot.
func (f *Filter) shardKeys(gen int64, shards int) []string {
	keys := make([]string, shards)
	for i := range keys {
		keys[i] = "{" + f.base + ":" + strconv.FormatInt(gen, 10) + ":" + strconv.Itoa(i) + "}"
	}
	return keys
}

// Config returns the layout of the generation this client probes.
func (f *Filter) Config() Config { return f.cur.Load().cfg }

// locate returns the shard and the k bit offsets (1-based: bit 0 is the
// readiness bit) of id in layout l, appended to offs.
func locate(cfg *Config, id string, offs []uint64) (int, []uint64) {
	h1 := xxhash.Sum64String(id)
	var d xxhash.Digest
	d.ResetWithSeed(seed2)
	_, _ = d.WriteString(id)
	h2 := d.Sum64()
	shard := int((h2 >> 32) * uint64(cfg.Shards) >> 32)
	// Enhanced double hashing (Dillinger & Manolios): x += y; y += i avoids
	// the short cycles of plain h1 + i·h2.
	x, y := h1, h2
	for i := range cfg.Hashes {
		offs = append(offs, 1+x%cfg.ShardBits)
		x += y
		y += uint64(i)
	}
	return shard, offs
}

// Probe is a test queued in a pipeline; read it with Result after the
// pipeline ran.
type Probe struct {
	f   *Filter
	id  string
	l   *layout
	cmd *redis.IntSliceCmd
}

// Queue adds a test of id to pipe as one BITFIELD_RO command, so that a caller
// can send it in the same round trip as its own commands.
func (f *Filter) Queue(ctx context.Context, pipe redis.Pipeliner, id string) Probe {
	l := f.cur.Load()
	cmd := testCmd(ctx, l, id)
	_ = pipe.Process(ctx, cmd)
	return Probe{f: f, id: id, l: l, cmd: cmd}
}

// Result reports whether the item may be present. If the shard was not
// ready, it re-reads the meta (at most ten times a second) and, if another
// process switched generations meanwhile, tests again in the new one: one
// more round trip. It returns ErrNotReady when the filter cannot answer, and
// Redis errors wrapped.
func (p Probe) Result(ctx context.Context) (bool, error) {
	maybe, err := verdict(p.cmd)
	if !errors.Is(err, ErrNotReady) {
		return maybe, err
	}
	if l := p.f.reloaded(ctx); l != nil && l.gen != p.l.gen {
		cmd := testCmd(ctx, l, p.id)
		_ = p.f.rdb.Process(ctx, cmd)
		return verdict(cmd)
	}
	return false, ErrNotReady
}

func verdict(cmd *redis.IntSliceCmd) (bool, error) {
	bits, err := cmd.Result()
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

func testCmd(ctx context.Context, l *layout, id string) *redis.IntSliceCmd {
	var buf [16]uint64
	shard, offs := locate(&l.cfg, id, buf[:0])
	args := make([]any, 0, 5+3*len(offs))
	args = append(args, "BITFIELD_RO", l.keys[shard], "GET", "u1", 0)
	for _, o := range offs {
		args = append(args, "GET", "u1", o)
	}
	return redis.NewIntSliceCmd(ctx, args...)
}

// Test reports whether id may be in the set (false: definitely not). It is
// one BITFIELD_RO command.
func (f *Filter) Test(ctx context.Context, id string) (bool, error) {
	l := f.cur.Load()
	cmd := testCmd(ctx, l, id)
	_ = f.rdb.Process(ctx, cmd)
	return Probe{f: f, id: id, l: l, cmd: cmd}.Result(ctx)
}

// TestMany tests several ids: one BITFIELD_RO per shard touched, pipelined.
// The result is in the order of ids. ErrNotReady if any touched shard is not
// ready.
func (f *Filter) TestMany(ctx context.Context, ids []string) ([]bool, error) {
	for attempt := 0; ; attempt++ {
		l := f.cur.Load()
		out, err := testMany(ctx, f.rdb, l, ids)
		if errors.Is(err, ErrNotReady) && attempt == 0 {
			if nl := f.reloaded(ctx); nl != nil && nl.gen != l.gen {
				continue
			}
		}
		return out, err
	}
}

func testMany(ctx context.Context, rdb redis.UniversalClient, l *layout, ids []string) ([]bool, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	groups := group(&l.cfg, ids)
	pipe := rdb.Pipeline()
	cmds := make(map[int]*redis.IntSliceCmd, len(groups))
	for shard, g := range groups {
		args := make([]any, 0, 5+3*len(g.offs))
		args = append(args, "BITFIELD_RO", l.keys[shard], "GET", "u1", 0)
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
	k := l.cfg.Hashes
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

func group(cfg *Config, ids []string) map[int]*shardGroup {
	groups := make(map[int]*shardGroup, min(cfg.Shards, len(ids)))
	var buf [16]uint64
	for i, id := range ids {
		shard, offs := locate(cfg, id, buf[:0])
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

// Add puts id into the filter. See AddMany.
func (f *Filter) Add(ctx context.Context, id string) error { return f.AddMany(ctx, []string{id}) }

// AddMany puts ids into the filter. Call it after the source of truth has
// committed them. One round trip reads the meta and sets the bits in the
// generation this client knows (one script per shard touched); if the meta
// names another generation, or a rebuild in progress, a second round trip
// sets them there too. AddMany does not make a filter ready (see Rebuild).
func (f *Filter) AddMany(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	l := f.cur.Load()
	pipe := f.rdb.Pipeline()
	meta := pipe.HGetAll(ctx, f.metaKey)
	added := pipe.HIncrBy(ctx, f.metaKey, "added", int64(len(ids)))
	queueSetBits(ctx, pipe, l, ids)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bloom: add: %w", err)
	}
	m, err := parseMeta(f.base, meta.Val())
	if err != nil { // the meta is gone: nothing to keep consistent until a rebuild
		return nil
	}
	f.checkSaturation(m.cur, uint64(added.Val()))
	var more []*layout
	if m.cur.gen != l.gen {
		more = append(more, m.cur)
		f.cur.Store(m.cur)
	}
	if m.next != nil && m.next.gen != l.gen {
		more = append(more, m.next)
	}
	if len(more) == 0 {
		return nil
	}
	pipe = f.rdb.Pipeline()
	for _, nl := range more {
		queueSetBits(ctx, pipe, nl, ids)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bloom: add: %w", err)
	}
	return nil
}

func (f *Filter) checkSaturation(l *layout, added uint64) {
	if f.opts.OnSaturated == nil || f.saturated.Load() == l.gen {
		return
	}
	k, m := float64(l.cfg.Hashes), float64(l.cfg.Bits)
	est := math.Pow(1-math.Exp(-k*float64(added)/m), k)
	if est > l.cfg.FPRate*(1+f.opts.SaturationMargin) && f.saturated.Swap(l.gen) != l.gen {
		f.opts.OnSaturated(Saturation{Generation: l.gen, Added: added, EstimatedFPRate: est, TargetFPRate: l.cfg.FPRate})
	}
}

func queueSetBits(ctx context.Context, pipe redis.Pipeliner, l *layout, ids []string) {
	for shard, g := range group(&l.cfg, ids) {
		args := make([]any, len(g.offs))
		for i, o := range g.offs {
			args[i] = o
		}
		setBits.Eval(ctx, pipe, []string{l.keys[shard]}, args...)
	}
}
