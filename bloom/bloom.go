// Package bloom is a bloom filter kept in Redis bitmaps, shared by every
// process that opens it by name.
//
// [Open] creates the filter (or adopts the layout stored in Redis), [Filter.Add]
// sets an ID's bits, [Filter.Test] probes them in one command, and
// [Filter.Rebuild] fills a new generation from the source of truth and switches
// to it atomically, so no existing ID is ever reported absent. A filter that
// is not ready (never built, or lost by Redis) answers ErrNotReady, and its
// users fail open. Sizing follows m = -n·ln p/(ln 2)², k = round(m/n·ln 2),
// with the bits of one ID in one shard of at most 64 MB (one command per
// probe, cluster-friendly). docs/design-notes.md has the layout in full.
package bloom

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

var (
	// ErrNotReady means the filter cannot answer "absent" now: it was never
	// rebuilt, or Redis lost it. Callers must fail open.
	ErrNotReady = errors.New("bloom: filter not ready")
	// ErrMismatch means the filter in Redis has another layout format or
	// hash than this client speaks, or (with Options.Strict) other sizing.
	ErrMismatch = errors.New("bloom: configuration differs from the filter in Redis")
	// ErrInvalid reports bad options or an empty key.
	ErrInvalid = errors.New("bloom: invalid argument")
	// ErrRebuilding means another process is rebuilding the filter.
	ErrRebuilding = errors.New("bloom: a rebuild is already running")
	// ErrUnavailable is wrapped by every error that Redis failing to
	// answer causes (the value of guard.ErrUnavailable and
	// lock.ErrUnavailable).
	ErrUnavailable = redisfail.ErrUnavailable
)

const (
	// DefaultMaxShardBytes is the default size limit of one bitmap key.
	DefaultMaxShardBytes = 64 << 20
	// maxShardBits is Redis's limit on a string's size (512 MiB).
	maxShardBits = 1 << 32
	// blockBits is the size of a block; bit 0 of each is the readiness bit.
	blockBits  = 512
	blockBytes = blockBits / 8
	usableBits = blockBits - 1
	hashName   = "xxh64x2-b512"
	metaFormat = "2"                // the meta hash's field set; a client refuses another
	seed2      = 0x9e3779b97f4a7c15 // seed of the second hash
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
	//go:embed lua/count_added.lua
	countAddedLua string

	createMeta = redis.NewScript(createMetaLua)
	setBits    = redis.NewScript(setBitsLua)
	countAdded = redis.NewScript(countAddedLua)
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
	// Strict makes Open fail with ErrMismatch when the filter in Redis was
	// sized otherwise. By default Open adopts the stored layout (Adopted
	// reports it): a filter resized by a Rebuild needs no coordinated
	// redeploy of every client's options.
	Strict bool
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
	ExpectedItems     uint64  // n the filter was sized for (Options.ExpectedItems)
	FalsePositiveRate float64 // p the filter was sized for (Options.FalsePositiveRate)
	Bits              uint64  // m: total bits, readiness bits included (Shards × ShardBits)
	Hashes            int     // k: bits per item
	Shards            int     // number of bitmap keys
	ShardBits         uint64  // bits per shard: a whole number of 512-bit blocks
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
	base          string          // the key given to Open, for messages
	names         keyspace.Filter // every key of the filter
	opts          Options         // resolved
	maxShardBytes uint64

	cur        atomic.Pointer[layout] // the generation probes use
	lastReload atomic.Int64           // unix nanos of the last meta re-read
	saturated  atomic.Int64           // generation OnSaturated was last called for
	adopted    bool                   // Open found other sizing than Options asked for, and took it
}

// Open opens the filter stored under key, creating it with opts' sizing if
// it does not exist, and adopting the stored sizing if it does (unless
// Options.Strict). Every key of the filter starts with "<key>:" (its meta is
// "<key>:meta", its shards "<key>:{<key>:<generation>:<shard>}"); key must
// not contain braces.
func Open(ctx context.Context, rdb redis.UniversalClient, key string, opts *Options) (*Filter, error) {
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if key == "" || strings.ContainsAny(key, "{}") {
		return nil, fmt.Errorf("%w: key %q must be non-empty and brace-free", ErrInvalid, key)
	}
	f := &Filter{rdb: rdb, base: key, names: keyspace.ForFilter(key), opts: o}
	want, err := configFor(o.ExpectedItems, o.FalsePositiveRate, o.MaxShardBytes)
	if err != nil {
		return nil, err
	}
	m, err := f.openMeta(ctx, want)
	if err != nil {
		return nil, err
	}
	if got := m.cur.cfg; got.Bits != want.Bits || got.Hashes != want.Hashes || got.Shards != want.Shards || got.ShardBits != want.ShardBits {
		if o.Strict {
			return nil, fmt.Errorf("%w: %s holds %d bits, %d hashes, %d shards; these options make %d bits, %d hashes, %d shards",
				ErrMismatch, key, got.Bits, got.Hashes, got.Shards, want.Bits, want.Hashes, want.Shards)
		}
		f.adopted = true
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
	if o.MaxShardBytes < 1024 || o.MaxShardBytes*8 > maxShardBits {
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
	m, _ := Size(n, p)
	// Items do not spread evenly over blocks, which raises the false-positive
	// rate of a blocked filter by about a fifth at 1%; 5% more bits win it
	// back (measured: TestFalsePositiveRate, TestMillionItemsSharded).
	m += m / 20
	k := int(math.Round(float64(m) / float64(n) * math.Ln2))
	blocks := (m + usableBits - 1) / usableBits
	perShard := min(maxShardBytes*8, maxShardBits) / blockBits // blocks a shard may hold
	shards := (blocks + perShard - 1) / perShard
	if shards > 1<<16 {
		return Config{}, fmt.Errorf("%w: %d items need %d shards", ErrInvalid, n, shards)
	}
	shardBits := (blocks + shards - 1) / shards * blockBits
	return Config{ExpectedItems: n, FalsePositiveRate: p, Bits: shards * shardBits, Hashes: k, Shards: int(shards), ShardBits: shardBits}, nil
}

// shardKeys returns the keys of a generation's shards. Each has a hash tag of
// its own, so shards spread over cluster slots, and a staging key shares its
// slot.
func shardKeys(names keyspace.Filter, gen int64, shards int) []string {
	keys := make([]string, shards)
	for i := range keys {
		keys[i] = names.Shard(gen, i)
	}
	return keys
}

// Adopted reports whether Open found the filter sized otherwise than its
// Options asked, and adopted the stored layout.
func (f *Filter) Adopted() bool { return f.adopted }

// Config returns the layout of the generation this client probes.
func (f *Filter) Config() Config { return f.cur.Load().cfg }

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
// or not ready, it re-reads the meta (at most ten times a second) and, if
// another process switched generations meanwhile, tests again in the new
// one: one more round trip. It returns ErrNotReady when the filter cannot
// answer, and Redis errors wrapped.
func (p Probe) Result(ctx context.Context) (bool, error) {
	maybe, err := verdict(p.cmd, p.bit)
	if !errors.Is(err, ErrNotReady) {
		return maybe, err
	}
	if l := p.f.reloaded(ctx); l != nil && l.gen != p.l.gen {
		cmd, b := probe(ctx, l, p.id)
		_ = p.f.rdb.Process(ctx, cmd)
		return verdict(cmd, b)
	}
	return false, ErrNotReady
}

func verdict(cmd *redis.StringCmd, b blockBitsOf) (bool, error) {
	block, err := cmd.Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("bloom: test: %w", redisfail.Wrap(err))
	}
	// A missing shard reads as an empty string: not ready.
	if len(block) < blockBytes || block[0]&0x80 == 0 {
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
	for i := range ids {
		ok, err := verdict(cmds[i], bits[i])
		if err != nil {
			return nil, err
		}
		out[i] = ok
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
	pipe := f.rdb.Pipeline()
	p := f.QueueAdd(ctx, pipe, ids)
	_, _ = pipe.Exec(ctx) // errors are read per command by Result
	return p.Result(ctx)
}

// PendingAdd is an AddMany queued in a caller's pipeline.
type PendingAdd struct {
	f     *Filter
	ids   []string
	l     *layout
	meta  *redis.MapStringStringCmd
	added *redis.Cmd // the meta's new count, or -1 if the meta is gone
	sets  []*redis.Cmd
}

// QueueAdd queues the first round trip of AddMany(ids) into pipe, so that a
// caller can send it with its own commands; call Result after the pipeline
// ran.
func (f *Filter) QueueAdd(ctx context.Context, pipe redis.Pipeliner, ids []string) *PendingAdd {
	p := &PendingAdd{f: f, ids: ids, l: f.cur.Load()}
	if len(ids) == 0 {
		return p
	}
	p.meta = pipe.HGetAll(ctx, f.names.Meta())
	p.added = countAdded.Eval(ctx, pipe, []string{f.names.Meta()}, len(ids))
	p.sets = queueSetBits(ctx, pipe, p.l, ids)
	return p
}

// Result finishes the add: it checks the queued commands and, if the meta
// names another generation or a rebuild in progress, sets the bits there too
// (one more round trip). Redis failures wrap ErrUnavailable.
func (p *PendingAdd) Result(ctx context.Context) error {
	if len(p.ids) == 0 {
		return nil
	}
	if err := p.err(); err != nil {
		return fmt.Errorf("bloom: add: %w", redisfail.Wrap(err))
	}
	f, l := p.f, p.l
	m, err := parseMeta(f.names, p.meta.Val())
	added, _ := p.added.Int64()
	if err != nil || added < 0 { // the meta is gone: nothing to keep consistent until a rebuild
		return nil
	}
	f.checkSaturation(m.cur, uint64(added))
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
	pipe := f.rdb.Pipeline()
	for _, nl := range more {
		queueSetBits(ctx, pipe, nl, p.ids)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bloom: add: %w", redisfail.Wrap(err))
	}
	return nil
}

// err is the first error of the queued commands, if any.
func (p *PendingAdd) err() error {
	if err := p.meta.Err(); err != nil {
		return err
	}
	if err := p.added.Err(); err != nil {
		return err
	}
	for _, c := range p.sets {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

func (f *Filter) checkSaturation(l *layout, added uint64) {
	if f.opts.OnSaturated == nil || f.saturated.Load() == l.gen {
		return
	}
	k, m := float64(l.cfg.Hashes), float64(l.cfg.Bits)
	est := math.Pow(1-math.Exp(-k*float64(added)/m), k)
	if est > l.cfg.FalsePositiveRate*(1+f.opts.SaturationMargin) && f.saturated.Swap(l.gen) != l.gen {
		f.opts.OnSaturated(Saturation{Generation: l.gen, Added: added, EstimatedFPRate: est, TargetFPRate: l.cfg.FalsePositiveRate})
	}
}

func queueSetBits(ctx context.Context, pipe redis.Pipeliner, l *layout, ids []string) []*redis.Cmd {
	var cmds []*redis.Cmd
	for shard, offs := range offsetsByShard(&l.cfg, ids) {
		args := make([]any, len(offs))
		for i, o := range offs {
			args[i] = o
		}
		cmds = append(cmds, setBits.Eval(ctx, pipe, []string{l.keys[shard]}, args...))
	}
	return cmds
}
