// Package guard puts a guard in front of cache-aside reads on Redis.
//
// guard.Get(ctx, g, id, load) answers from Redis when it can and calls load
// (the source of truth, usually a database) only when it must. First the ID
// is checked (malformed IDs cost no Redis command). Then, in one round trip,
// a pipeline asks the Guard's bloom filter whether the ID may exist and GETs
// its cache entry. A cached value is decoded and returned; a cached empty-value
// marker ("the source of truth had no such ID", kept for EmptyTTL) and an ID
// the filter has never seen both end in ErrNotFound without calling load: that
// stops penetration by floods of unknown IDs. On a miss, the ID's flight calls
// load once, however many callers in the process ask at the same time (a
// stampede costs one load, not hundreds), and stores the value for TTL ± Jitter
// so keys loaded together do not expire together (no avalanche). Concurrent
// callers for one key share even a hit's round trip.
//
// One Guard serves one kind of entity: its name scopes its keys, filter and
// TTLs. Register new IDs with Add after the database commit, drop stale
// entries with Invalidate after an update, and fill the filter from the
// database with Rebuild: until a filter has been rebuilt once, and whenever
// Redis has lost it, Get bypasses it (fail open) rather than reject an ID that
// exists.
package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/loader"
)

var (
	// ErrNotFound: the ID does not exist in the source of truth (the bloom
	// filter has never seen it, an empty marker is cached, or load said so).
	// A loader reports absence by returning an error that wraps ErrNotFound.
	ErrNotFound = errors.New("cacheguard: not found")
	// ErrInvalidKey: the ID is empty, too long or holds control bytes.
	ErrInvalidKey = errors.New("cacheguard: invalid key")
	// ErrLoaderPanic is wrapped by the error callers get when load panicked.
	ErrLoaderPanic = loader.ErrPanic
	// ErrInvalidOptions: New was given a bad name or option.
	ErrInvalidOptions = errors.New("cacheguard: invalid options")
)

//go:embed lua/del_if_equal.lua
var delIfEqualLua string

var delIfEqual = redis.NewScript(delIfEqualLua)

// Options configures a Guard. A nil *Options means all defaults; a zero field
// means that field's default.
type Options struct {
	// KeyPrefix starts every key of the Guard: "<KeyPrefix>:<name>:...".
	// Default "cg". Printable ASCII, no braces or spaces.
	KeyPrefix string
	// TTL of a cached value, before jitter. Default 10 minutes.
	TTL time.Duration
	// EmptyTTL of an empty-value marker, before jitter. Default 1 minute.
	EmptyTTL time.Duration
	// Jitter spreads TTLs uniformly over ±Jitter·TTL. Default 0.10 (±10%);
	// a negative value disables jitter; at most 0.9.
	Jitter float64
	// ExpectedItems sizes the bloom filter. Default 1,000,000 (see
	// bloom.Options).
	ExpectedItems uint64
	// FalsePositiveRate is the filter's target rate at ExpectedItems, in
	// (0, 0.5]. Default 0.01.
	FalsePositiveRate float64
	// MaxKeyLen caps an ID's length in bytes. Default 128.
	MaxKeyLen int
	// Codec encodes cached values. Default codec.Msgpack.
	Codec codec.Codec
	// LoadTimeout bounds a flight (Redis read, load and write) on its
	// detached context. Default 10 seconds.
	LoadTimeout time.Duration
	// Logger receives warnings (filter bypassed, corrupt entries, failed
	// cache writes). Default: no logging.
	Logger *slog.Logger
}

// Guard guards the reads of one kind of entity. It is safe for concurrent use.
type Guard struct {
	rdb   redis.UniversalClient
	name  string
	opts  Options // resolved: no zero fields
	keys  keyspace
	bloom *bloom.Filter
	log   *slog.Logger

	flights   loader.Group[flight]
	stats     counters
	bypassing atomic.Bool // the filter answered ErrNotReady last time (logged once per episode)
}

// New opens the Guard called name (letters, digits, '_', '-', '.') on rdb,
// creating its bloom filter in Redis if needed. Processes that share a name
// must agree on ExpectedItems and FalsePositiveRate (else bloom.ErrMismatch).
func New(ctx context.Context, rdb redis.UniversalClient, name string, opts *Options) (*Guard, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOptions)
	}
	if !validName(name) {
		return nil, fmt.Errorf("%w: name %q (want 1-64 of [A-Za-z0-9_.-])", ErrInvalidOptions, name)
	}
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	g := &Guard{
		rdb:  rdb,
		name: name,
		opts: o,
		keys: keyspace{prefix: o.KeyPrefix + ":" + name + ":", maxLen: o.MaxKeyLen},
		log:  o.Logger.With("guard", name),
	}
	g.bloom, err = bloom.Open(ctx, rdb, g.keys.prefix+"bf", &bloom.Options{
		ExpectedItems: o.ExpectedItems, FalsePositiveRate: o.FalsePositiveRate,
	})
	if errors.Is(err, bloom.ErrInvalid) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if err != nil {
		return nil, fmt.Errorf("cacheguard: %s: %w", name, err)
	}
	return g, nil
}

func resolve(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	bad := func(format string, args ...any) (Options, error) {
		return Options{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "cg"
	}
	if !validPrefix(o.KeyPrefix) {
		return bad("KeyPrefix %q", o.KeyPrefix)
	}
	if o.TTL == 0 {
		o.TTL = 10 * time.Minute
	}
	if o.EmptyTTL == 0 {
		o.EmptyTTL = time.Minute
	}
	if o.TTL < time.Millisecond || o.EmptyTTL < time.Millisecond {
		return bad("TTL %v and EmptyTTL %v must be at least 1ms", o.TTL, o.EmptyTTL)
	}
	switch {
	case o.Jitter == 0:
		o.Jitter = 0.10
	case o.Jitter < 0:
		o.Jitter = 0
	case o.Jitter > 0.9:
		return bad("Jitter %v above 0.9", o.Jitter)
	}
	if o.MaxKeyLen == 0 {
		o.MaxKeyLen = 128
	}
	if o.MaxKeyLen < 1 || o.MaxKeyLen > 4096 {
		return bad("MaxKeyLen %d not in [1, 4096]", o.MaxKeyLen)
	}
	if o.Codec == nil {
		o.Codec = codec.Msgpack
	}
	if o.LoadTimeout == 0 {
		o.LoadTimeout = 10 * time.Second
	}
	if o.LoadTimeout < 0 {
		return bad("LoadTimeout %v", o.LoadTimeout)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Name returns the Guard's name.
func (g *Guard) Name() string { return g.name }

// outcome is how a flight ended, counted once per caller.
type outcome uint8

const (
	outHit outcome = iota + 1
	outEmpty
	outRejected
	outLoaded
	outFailed
)

// flight is what one flight hands to all its callers: the frame to decode
// (each caller decodes its own copy, so no two callers share a T), and how it
// ended.
type flight struct {
	frame   []byte
	outcome outcome
}

// Get returns the value of id: from the cache, or from load on a miss. It
// returns ErrNotFound (test with errors.Is) when the ID does not exist,
// ErrInvalidKey for a malformed ID, the load's error wrapped when load fails,
// and Redis errors wrapped (never as ErrNotFound). load runs on a context
// detached from ctx and bounded by LoadTimeout, shared by every caller of id
// in this process; Get itself returns as soon as ctx is done.
func Get[T any](ctx context.Context, g *Guard, id string, load func(ctx context.Context, id string) (T, error)) (T, error) {
	var zero T
	if g == nil || load == nil {
		return zero, errors.New("cacheguard: Get needs a non-nil Guard and load function")
	}
	vkey, err := g.keys.value(id)
	if err != nil {
		return zero, err
	}
	// The caller whose function runs the flight keeps the value it decoded
	// on a hit; the flight's writes to these happen before Do returns.
	var (
		mine, decoded bool
		v             T
	)
	fl, shared, err := g.flights.Do(ctx, vkey, func(fctx context.Context) (flight, error) {
		mine = true
		return fetch(fctx, g, id, vkey, load, &v, &decoded)
	})
	g.stats.count(fl.outcome, shared && !mine)
	if err != nil {
		return zero, err
	}
	if mine && decoded {
		return v, nil
	}
	if err := codec.Decode(g.opts.Codec, fl.frame, &v); err != nil {
		return zero, fmt.Errorf("cacheguard: %s %q: decode: %w", g.name, id, err)
	}
	return v, nil
}

// fetch is one flight: the read round trip, then on a miss the load and the
// write. On a hit it decodes into out (to tell a corrupt entry from a good
// one) and sets *decoded.
func fetch[T any](ctx context.Context, g *Guard, id, vkey string, load func(context.Context, string) (T, error), out *T, decoded *bool) (flight, error) {
	pipe := g.rdb.Pipeline()
	probe := g.bloom.Queue(ctx, pipe, id)
	get := pipe.Get(ctx, vkey)
	_, _ = pipe.Exec(ctx) // errors are read per command below
	raw, err := get.Bytes()
	switch {
	case err == nil:
		derr := codec.Decode(g.opts.Codec, raw, out)
		if derr == nil {
			*decoded = true
			return flight{frame: raw, outcome: outHit}, nil
		}
		if errors.Is(derr, codec.ErrEmpty) {
			return flight{outcome: outEmpty}, ErrNotFound
		}
		// Corrupt or unreadable by this T: drop it unless a writer has
		// already replaced it, then reload. The ID existed, so the filter
		// is not asked.
		var zero T
		*out = zero
		g.stats.corrupt.Add(1)
		g.log.WarnContext(ctx, "cacheguard: dropping corrupt cache entry", "key", vkey, "err", derr)
		if err := delIfEqual.Run(ctx, g.rdb, []string{vkey}, raw).Err(); err != nil {
			g.redisError(ctx, "delete corrupt entry", err)
		}
	case errors.Is(err, redis.Nil):
		maybe, berr := probe.Result()
		switch {
		case berr == nil && !maybe:
			return flight{outcome: outRejected}, ErrNotFound
		case berr == nil:
			if g.bypassing.Load() && g.bypassing.CompareAndSwap(true, false) {
				g.log.InfoContext(ctx, "cacheguard: bloom filter answering again")
			}
		case errors.Is(berr, bloom.ErrNotReady):
			g.stats.bypasses.Add(1)
			if g.bypassing.CompareAndSwap(false, true) {
				g.log.WarnContext(ctx, "cacheguard: bloom filter not ready (never rebuilt, or lost by Redis); failing open until Rebuild")
			}
		default:
			g.redisError(ctx, "bloom probe", berr)
			return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", g.name, id, berr)
		}
	default:
		g.redisError(ctx, "read", err)
		return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: read: %w", g.name, id, err)
	}

	// The read above is bounded by the client's timeouts; the load and the
	// write get LoadTimeout. (A deadline on the whole flight would cost a
	// timer and four allocations on every hit.)
	ctx, cancel := context.WithTimeout(ctx, g.opts.LoadTimeout)
	defer cancel()
	g.stats.loads.Add(1)
	val, err := load(ctx, id)
	if errors.Is(err, ErrNotFound) {
		if err := g.rdb.Set(ctx, vkey, codec.Empty(), g.jitter(g.opts.EmptyTTL)).Err(); err != nil {
			g.redisError(ctx, "write empty marker", err)
		}
		return flight{outcome: outLoaded}, ErrNotFound
	}
	if err != nil {
		g.stats.loadErrors.Add(1)
		return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: load: %w", g.name, id, err)
	}
	frame, err := codec.Encode(g.opts.Codec, val)
	if err != nil {
		g.stats.loadErrors.Add(1)
		return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", g.name, id, err)
	}
	if err := g.rdb.Set(ctx, vkey, frame, g.jitter(g.opts.TTL)).Err(); err != nil {
		// The value is good; only caching it failed. Serve it.
		g.redisError(ctx, "write value", err)
	}
	return flight{frame: frame, outcome: outLoaded}, nil
}

func (g *Guard) redisError(ctx context.Context, op string, err error) {
	g.stats.redisErrors.Add(1)
	g.log.WarnContext(ctx, "cacheguard: redis "+op+" failed", "err", err)
}

// jitter returns d spread uniformly over d·(1 ± Jitter), at least 1ms.
func (g *Guard) jitter(d time.Duration) time.Duration {
	if j := g.opts.Jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d, time.Millisecond)
}

// Add registers newly created IDs in the bloom filter. Call it after the
// source of truth has committed them, before they are read: one BITFIELD per
// filter shard touched. Malformed IDs make Add fail before any Redis command.
func (g *Guard) Add(ctx context.Context, ids ...string) error {
	for _, id := range ids {
		if _, err := g.keys.value(id); err != nil {
			return err
		}
	}
	if err := g.bloom.AddMany(ctx, ids); err != nil {
		return fmt.Errorf("cacheguard: %s: %w", g.name, err)
	}
	return nil
}

// Invalidate drops the cached values and empty markers of ids, so the next
// Get loads them again. Call it after the source of truth has changed them.
func (g *Guard) Invalidate(ctx context.Context, ids ...string) error {
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		k, err := g.keys.value(id)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	var err error
	switch len(keys) {
	case 0:
		return nil
	case 1:
		err = g.rdb.Del(ctx, keys[0]).Err()
	default:
		// One DEL per key: the keys live in different cluster slots.
		pipe := g.rdb.Pipeline()
		for _, k := range keys {
			pipe.Del(ctx, k)
		}
		_, err = pipe.Exec(ctx)
	}
	if err != nil {
		g.redisError(ctx, "invalidate", err)
		return fmt.Errorf("cacheguard: %s: invalidate: %w", g.name, err)
	}
	return nil
}

// Rebuild loads every existing ID from the source of truth into the bloom
// filter and then lets the filter answer "absent". Run it once when a Guard is
// first deployed and whenever Redis has lost the filter; until then Get fails
// open (counted in Stats.BloomBypasses). opts may be nil.
func (g *Guard) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *bloom.RebuildOptions) (int, error) {
	n, err := g.bloom.Rebuild(ctx, ids, opts)
	if err != nil {
		return n, fmt.Errorf("cacheguard: %s: %w", g.name, err)
	}
	return n, nil
}
