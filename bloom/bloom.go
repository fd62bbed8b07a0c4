// Package bloom is a bloom filter kept in Redis bitmaps, shared by every
// process that opens it by name. [Filter.Test] probes an ID in one command,
// and [Filter.Rebuild] fills a new generation from the source of truth and
// switches to it atomically, so no existing ID is ever reported absent. A
// filter that is not ready (never built, or lost by Redis) answers
// ErrNotReady, and its users fail open. docs/design.md has the layout.
package bloom

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

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
	// ErrTooSmall: a rebuild read more IDs than its sizing holds at twice
	// the target false-positive rate; the current generation stays.
	ErrTooSmall = errors.New("bloom: the filter's sizing is too small for the IDs")
	// ErrShortSource: a rebuild read fewer than half the IDs the filter
	// holds (the last rebuild's count, or the bits of a ready filter), so
	// its generation would answer "absent" for IDs that exist; the current
	// generation stays unless RebuildOptions.Force.
	ErrShortSource = errors.New("bloom: the source has far fewer IDs than the filter holds")
	// ErrUnavailable is wrapped by every error that Redis failing to
	// answer causes (the value of guard.ErrUnavailable and
	// lock.ErrUnavailable).
	ErrUnavailable = redisfail.ErrUnavailable
)

const (
	// DefaultMaxShardBytes is the default size limit of one bitmap key.
	DefaultMaxShardBytes = 64 << 20
	// DefaultExpectedItems and DefaultFalsePositiveRate size a filter when
	// Options leave them zero.
	DefaultExpectedItems     = 1_000_000
	DefaultFalsePositiveRate = 0.01
	// maxShardBits is Redis's limit on a string's size (512 MiB).
	maxShardBits = 1 << 32
	// blockBits is the size of a block; bit 0 of each is the readiness bit.
	blockBits  = 512
	blockBytes = blockBits / 8
	blockWords = blockBits / 64
	usableBits = blockBits - 1
	hashName   = "xxh64x2-b512"
	metaFormat = "2"                // the meta hash's field set; a client refuses another
	seed2      = 0x9e3779b97f4a7c15 // seed of the second hash
	// reloadEvery limits a client's re-reads of the meta while a generation
	// is not ready (follow): a filter being built costs each process at
	// most ten HGETALLs a second.
	reloadEvery = 100 * time.Millisecond
	// goneEvery is reloadEvery for a shard Redis lost while the meta names
	// it: at most 100 HGETALLs a second while the loss lasts, and a switch
	// made by a rebuild right after it is followed within 10 ms.
	goneEvery = 10 * time.Millisecond
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
	// OnSaturated, if set, is called once per generation and client when
	// Adds push the estimated false-positive rate above the target by more
	// than SaturationMargin: time to Rebuild with a larger ExpectedItems.
	OnSaturated func(Saturation)
	// OnSwitch, if set, is called when this client moves to a generation
	// other than the one it probed (another process rebuilt the filter, or
	// Redis lost it), from the probe's goroutine: a copy RefreshCopy took
	// is of the old generation. It must not block.
	OnSwitch func(gen int64)
	// SaturationMargin is the relative excess that triggers OnSaturated.
	// Default 0.5 (a 1% target fires at 1.5%).
	SaturationMargin float64
	// Strict makes Open fail with ErrMismatch when the filter in Redis was
	// sized otherwise; by default Open adopts the stored layout (Adopted), so
	// a Rebuild's resize needs no coordinated redeploy of every client.
	Strict bool
}

// Saturation is what OnSaturated is told.
type Saturation struct {
	Generation      int64
	Added           uint64  // items counted into this generation
	EstimatedFPRate float64 // from the bits: fill^k
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
	gen    int64
	cfg    Config
	keys   []string
	loaded uint64 // IDs its rebuild read (0: none, or not known)
}

// Filter is an open bloom filter. It is safe for concurrent use.
type Filter struct {
	rdb           redis.UniversalClient
	base          string          // the key given to Open, for messages
	names         keyspace.Filter // every key of the filter
	opts          Options         // resolved
	maxShardBytes uint64

	cur          atomic.Pointer[layout] // the generation probes use
	reads        metaReads              // re-reads of the meta (metaSince, follow)
	saturated    atomic.Int64           // generation OnSaturated was last called for
	lastSatCheck atomic.Int64           // unix nanos of the last look at the bits for saturation
	adopted      bool                   // Open found other sizing than Options asked for, and took it
	mem          localCopy              // the bits in process memory, once RefreshCopy fetched them
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
	o.ExpectedItems = cmp.Or(o.ExpectedItems, DefaultExpectedItems)
	o.FalsePositiveRate = cmp.Or(o.FalsePositiveRate, DefaultFalsePositiveRate)
	o.MaxShardBytes = cmp.Or(o.MaxShardBytes, DefaultMaxShardBytes)
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

// shardKeys returns the keys of a generation's shards (keyspace.Filter.Shard).
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
