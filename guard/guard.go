// Package guard puts a guard in front of cache-aside reads on Redis.
//
// guard.Get(ctx, g, id, load) answers from Redis when it can and calls load
// (the source of truth, usually a database) only when it must. First the ID
// is checked (malformed IDs cost no Redis command). Then, in one round trip,
// a pipeline asks the Guard's bloom filter whether the ID may exist and GETs
// its cache entry. A cached value is decoded and returned; a cached empty-value
// marker ("the source of truth had no such ID", kept for EmptyTTL) and an ID
// the filter has never seen both end in ErrNotFound without calling load: that
// stops penetration by floods of unknown IDs. Concurrent callers of one ID in
// a process share one flight, even for a hit's round trip. On a miss the
// flight takes the ID's Redis lock, so that one process at a time loads it:
// the holder checks the cache again, calls load under a watchdog, writes the
// value for TTL ± Jitter (keys loaded together do not expire together: no
// avalanche) in a script that refuses the write if an Invalidate came after
// the lock was taken (fencing), releases the lock and publishes the ID. Flights
// in other processes wait for that publish and then read the cache; if the
// holder dies, its lock expires after LockTTL and the next one loads. A hot
// key expiring under hundreds of callers in many processes costs one load.
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
	"net"
	"strconv"
	"sync"
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
	// ErrBusy: another process was loading the ID for longer than LockWait.
	ErrBusy = loader.ErrBusy
	// ErrClosed: the Guard was closed.
	ErrClosed = errors.New("cacheguard: guard closed")
	// ErrUnavailable is wrapped (with the Redis error) by every error that
	// Redis failing to answer causes: retry later, or serve from the source
	// of truth. It is never ErrNotFound.
	ErrUnavailable = errors.New("cacheguard: redis unavailable")
)

var (
	//go:embed lua/del_if_equal.lua
	delIfEqualLua string
	//go:embed lua/set_if_fence.lua
	setIfFenceLua string

	delIfEqual = redis.NewScript(delIfEqualLua)
	setIfFence = redis.NewScript(setIfFenceLua)
)

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
	// LoadTimeout bounds a load and its cache write, on a context detached
	// from the callers'. Default 10 seconds.
	LoadTimeout time.Duration
	// LockTTL is the lease of an ID's load lock. A watchdog renews it while
	// the load runs, so it only matters when a loading process dies: the
	// others take over about LockTTL later. Default 5 seconds.
	LockTTL time.Duration
	// LockWait bounds how long a flight waits for another process's load of
	// the same ID before Get returns ErrBusy. Default LoadTimeout + LockTTL,
	// long enough for one full load plus one lost holder.
	LockWait time.Duration
	// LoadOnBusy makes a Get that waited LockWait call load itself (without
	// caching the result) instead of returning ErrBusy.
	LoadOnBusy bool
	// RebuildFrom, if set, lists every existing ID from the source of truth.
	// When a Get finds the bloom filter not ready (never built, or lost by
	// Redis), the Guard rebuilds it from RebuildFrom in the background (at
	// most one attempt a minute per process; one rebuild at a time across
	// processes). Without it, call Rebuild yourself.
	RebuildFrom func(ctx context.Context) iter.Seq2[string, error]
	// Local, if set, keeps values in process memory too (see LocalOptions):
	// a hit then costs no round trip. Off by default.
	Local *LocalOptions
	// OnBloomSaturated, if set, is told when the IDs added push the filter's
	// estimated false-positive rate 50% above FalsePositiveRate: rebuild it
	// bigger (Rebuild with bloom.RebuildOptions.ExpectedItems).
	OnBloomSaturated func(bloom.Saturation)
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

	local     *local               // the in-process cache, or nil
	flights   loader.Group[flight] // one flight per value key in this process
	coord     *loader.Coordinator  // one load per value key across processes
	stats     counters
	bypassing atomic.Bool // the filter answered ErrNotReady last time (logged once per episode)

	// Background rebuilds (RebuildFrom): each runs in a goroutine owned by
	// the Guard, tracked by rebuilds; Close closes closing, which cancels
	// them, and waits.
	lastRebuild    atomic.Int64 // unix nanos of the last automatic attempt
	lastSlotReload atomic.Int64 // unix nanos of the last cluster slot-map reload we asked for
	rebuilds       sync.WaitGroup
	closing        chan struct{}
	closeOnce      sync.Once

	life   sync.RWMutex // read-held by every running flight; Close takes it to set closed
	closed bool         // guarded by life
}

// New opens the Guard called name (letters, digits, '_', '-', '.') on rdb,
// creating its bloom filter in Redis if needed. Processes that share a name
// must agree on ExpectedItems and FalsePositiveRate (else bloom.ErrMismatch).
// Close the Guard when done with it: it may hold a pub/sub subscription.
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

		closing: make(chan struct{}),
	}
	g.bloom, err = bloom.Open(ctx, rdb, g.keys.prefix+"bf", &bloom.Options{
		ExpectedItems: o.ExpectedItems, FalsePositiveRate: o.FalsePositiveRate,
		OnSaturated: func(s bloom.Saturation) {
			g.log.Warn("cacheguard: bloom filter saturated; rebuild it with a larger ExpectedItems",
				"added", s.Added, "estimated_fp_rate", s.EstimatedFPRate, "target", s.TargetFPRate)
			if o.OnBloomSaturated != nil {
				o.OnBloomSaturated(s)
			}
		},
	})
	if errors.Is(err, bloom.ErrInvalid) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if err != nil {
		return nil, fmt.Errorf("cacheguard: %s: %w", name, err)
	}
	if o.Local != nil {
		if g.local, err = newLocal(ctx, rdb, g.keys.prefix+"invalidated", *o.Local); err != nil {
			return nil, err
		}
	}
	g.coord = loader.NewCoordinator(rdb, g.keys.prefix+"loaded", &loader.CoordinatorOptions{
		LockTTL:    o.LockTTL,
		LockWait:   o.LockWait,
		LoadOnBusy: o.LoadOnBusy,
		// A fence must outlive any load that may still write with it; past
		// that, an expired fence only refuses a late write, which is safe.
		FenceTTL: 2*(o.LoadTimeout+o.LockTTL) + time.Minute,
		OnLockLost: func(key string, err error) {
			g.log.Warn("cacheguard: load lock lost while loading", "key", key, "err", err)
		},
	})
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
	if o.LockTTL == 0 {
		o.LockTTL = 5 * time.Second
	}
	if o.LockWait == 0 {
		o.LockWait = o.LoadTimeout + o.LockTTL
	}
	if o.LoadTimeout < 0 || o.LockTTL < 10*time.Millisecond || o.LockWait < 0 {
		return bad("LoadTimeout %v, LockTTL %v (>= 10ms), LockWait %v", o.LoadTimeout, o.LockTTL, o.LockWait)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Name returns the Guard's name.
func (g *Guard) Name() string { return g.name }

// Close ends the Guard's pub/sub subscription and any background rebuild.
//
// Close waits for the flights that are running (each is bounded by the read,
// LoadTimeout and LockWait) so that their cache writes land before the caller
// closes the Redis client; later Gets fail with ErrClosed.
func (g *Guard) Close() error {
	g.closeOnce.Do(func() { close(g.closing) })
	g.rebuilds.Wait()
	g.life.Lock()
	g.closed = true
	g.life.Unlock()
	if g.local != nil {
		_ = g.local.close()
	}
	return g.coord.Close()
}

// Info describes the Guard's bloom filter as it is in Redis (see bloom.Info;
// it counts bits, so keep it off the request path).
func (g *Guard) Info(ctx context.Context) (bloom.Info, error) {
	in, err := g.bloom.Info(ctx)
	if err != nil {
		return in, fmt.Errorf("cacheguard: %s: %w", g.name, err)
	}
	return in, nil
}

// autoRebuild starts a background Rebuild from RebuildFrom, at most once a
// minute per process.
func (g *Guard) autoRebuild() {
	if g.opts.RebuildFrom == nil {
		return
	}
	now, last := time.Now().UnixNano(), g.lastRebuild.Load()
	if (last != 0 && now-last < int64(time.Minute)) || !g.lastRebuild.CompareAndSwap(last, now) {
		return
	}
	select {
	case <-g.closing:
		return
	default:
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
			g.log.Error("cacheguard: automatic bloom rebuild failed", "err", err)
		default:
			g.log.Info("cacheguard: bloom filter rebuilt", "ids", n)
		}
	}()
}

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
	epoch   uint64 // the local cache's epoch when the flight began
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
	if g.local != nil {
		if frame, ok := g.local.get(vkey); ok {
			var v T
			if codec.Decode(g.opts.Codec, frame, &v) == nil {
				g.stats.localHits.Add(1)
				return v, nil
			}
			g.local.drop(vkey)
		}
	}
	// The caller whose function runs the flight keeps the value it decoded
	// on a hit; the flight's writes to these happen before Do returns.
	var (
		mine, decoded bool
		v             T
	)
	fl, shared, err := g.flights.Do(ctx, vkey, func(fctx context.Context) (flight, error) {
		mine = true
		// Close waits for running flights (they write to Redis after their
		// callers may have left); none starts after it.
		g.life.RLock()
		defer g.life.RUnlock()
		if g.closed {
			return flight{outcome: outFailed}, ErrClosed
		}
		var epoch uint64
		if g.local != nil {
			epoch = g.local.epoch.Load() // before the read: see local.put
		}
		fl, err := fetch(fctx, g, id, vkey, load, &v, &decoded)
		fl.epoch = epoch
		return fl, err
	})
	g.stats.count(fl.outcome, shared && !mine)
	if err != nil {
		return zero, err
	}
	if g.local != nil && mine {
		g.local.put(vkey, fl.frame, fl.epoch)
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
	r, ok := peekedFor(ctx, g, id)
	if !ok {
		var err error
		if r, err = g.read(ctx, id, vkey); err != nil {
			return flight{outcome: outFailed}, err
		}
	}
	switch r.verdict {
	case verdictRejected:
		return flight{outcome: outRejected}, ErrNotFound
	case verdictEntry:
		if fl, ok, err := answer(ctx, g, vkey, r.raw, out, decoded); ok {
			return fl, err
		}
	}
	return fill(ctx, g, id, vkey, load, out, decoded)
}

// answer decodes a cache entry into out. ok is false when the entry was
// corrupt (or unreadable by this T): it is dropped unless a writer has
// already replaced it, and the caller loads. The ID existed, so the filter
// is not asked again.
func answer[T any](ctx context.Context, g *Guard, vkey string, raw []byte, out *T, decoded *bool) (fl flight, ok bool, err error) {
	var zero T
	*out = zero // no field of an earlier, failed decode survives
	switch derr := codec.Decode(g.opts.Codec, raw, out); {
	case derr == nil:
		*decoded = true
		return flight{frame: raw, outcome: outHit}, true, nil
	case errors.Is(derr, codec.ErrEmpty):
		return flight{outcome: outEmpty}, true, ErrNotFound
	default:
		*out = zero
		g.dropCorrupt(ctx, vkey, raw, derr)
		return flight{}, false, nil
	}
}

// verdict is what the read round trip found.
type verdict uint8

const (
	verdictMiss     verdict = iota // no entry, and the filter says maybe (or cannot say)
	verdictRejected                // no entry, and the filter says absent
	verdictEntry                   // a cached value or empty marker: raw
)

type readResult struct {
	verdict verdict
	raw     []byte
}

// read is the one round trip of every Get: the bloom probe and the GET of the
// value key, pipelined. Redis failures come back wrapping ErrUnavailable.
func (g *Guard) read(ctx context.Context, id, vkey string) (readResult, error) {
	pipe := g.rdb.Pipeline()
	probe := g.bloom.Queue(ctx, pipe, id)
	get := pipe.Get(ctx, vkey)
	_, _ = pipe.Exec(ctx) // errors are read per command below
	raw, err := get.Bytes()
	switch {
	case err == nil:
		return readResult{verdict: verdictEntry, raw: raw}, nil
	case !errors.Is(err, redis.Nil):
		g.redisError(ctx, "read", err)
		return readResult{}, fmt.Errorf("cacheguard: %s %q: read: %w: %w", g.name, id, ErrUnavailable, err)
	}
	maybe, err := probe.Result(ctx)
	if maybe, err = g.filterSays(ctx, id, maybe, err); err != nil {
		return readResult{}, err
	}
	if !maybe {
		return readResult{verdict: verdictRejected}, nil
	}
	return readResult{verdict: verdictMiss}, nil
}

// filterSays turns a bloom answer into the Guard's: a filter that is not
// ready means "maybe" (fail open: counted, logged once per episode, and a
// rebuild started if RebuildFrom is set); Redis failures wrap ErrUnavailable.
func (g *Guard) filterSays(ctx context.Context, id string, maybe bool, err error) (bool, error) {
	switch {
	case err == nil:
		if g.bypassing.Load() && g.bypassing.CompareAndSwap(true, false) {
			g.log.InfoContext(ctx, "cacheguard: bloom filter answering again")
		}
		return maybe, nil
	case errors.Is(err, bloom.ErrNotReady):
		g.stats.bypasses.Add(1)
		if g.bypassing.CompareAndSwap(false, true) {
			g.log.WarnContext(ctx, "cacheguard: bloom filter not ready (never rebuilt, or lost by Redis); failing open until Rebuild")
		}
		g.autoRebuild()
		return true, nil
	default:
		g.redisError(ctx, "bloom probe", err)
		return false, fmt.Errorf("cacheguard: %s %q: %w: %w", g.name, id, ErrUnavailable, err)
	}
}

// peekKey is the context key under which Peek leaves what it read.
type peekKey struct{}

type peeked struct {
	g    *Guard
	id   string
	r    readResult
	used atomic.Bool // a peek serves one Get: a later Get in the same request reads afresh
}

func peekedFor(ctx context.Context, g *Guard, id string) (readResult, bool) {
	p, ok := ctx.Value(peekKey{}).(*peeked)
	if !ok || p.g != g || p.id != id || p.used.Swap(true) {
		return readResult{}, false
	}
	return p.r, true
}

// Peek does Get's read round trip (bloom probe and cache GET) without
// loading, and reports whether id may exist: false when the filter has never
// seen it or an empty marker is cached. It returns a context that carries
// what it read, so that the next Get of the same id on this Guard with that
// context (or one derived from it) skips its own read: HTTP middleware built
// on Peek costs no extra round trip. Only that one Get uses it; any later Get
// reads afresh (say, after the handler wrote and invalidated). A malformed id gives ErrInvalidKey without a
// Redis command; Redis failures wrap ErrUnavailable. A filter that is not
// ready answers true (fail open).
func (g *Guard) Peek(ctx context.Context, id string) (context.Context, bool, error) {
	vkey, err := g.keys.value(id)
	if err != nil {
		return ctx, false, err
	}
	if g.local != nil {
		if _, ok := g.local.get(vkey); ok { // Get will answer from memory
			return ctx, true, nil
		}
	}
	r, err := g.read(ctx, id, vkey)
	if err != nil {
		return ctx, false, err
	}
	exists := true
	switch {
	case r.verdict == verdictRejected:
		g.stats.rejects.Add(1)
		exists = false
	case r.verdict == verdictEntry && len(r.raw) == 1 && r.raw[0] == codec.KindEmpty:
		g.stats.empty.Add(1)
		exists = false
	}
	return context.WithValue(ctx, peekKey{}, &peeked{g: g, id: id, r: r}), exists, nil
}

// fill runs a miss through the Coordinator: one load per key across
// processes, written with the lock's fence.
func fill[T any](ctx context.Context, g *Guard, id, vkey string, load func(context.Context, string) (T, error), out *T, decoded *bool) (flight, error) {
	var (
		res     flight // what the last check or load found
		loadErr error  // the last load's own outcome, kept across fence retries
	)
	// check reads the cache in the Coordinator's round trip (after the lock
	// attempt) or in one of its own.
	check := func(ctx context.Context, pipe redis.Pipeliner) func() (bool, error) {
		get := pipe.Get(ctx, vkey)
		return func() (bool, error) {
			raw, err := get.Bytes()
			switch {
			case errors.Is(err, redis.Nil):
				return false, nil
			case err != nil:
				g.redisError(ctx, "read", err)
				res = flight{outcome: outFailed}
				return true, fmt.Errorf("cacheguard: %s %q: read: %w: %w", g.name, id, ErrUnavailable, err)
			}
			fl, ok, err := answer(ctx, g, vkey, raw, out, decoded)
			if ok {
				res = fl
			}
			return ok, err
		}
	}
	write := func(ctx context.Context, fence int64, frame []byte, ttl time.Duration) error {
		if fence == 0 { // LoadOnBusy: no lock, no write
			return nil
		}
		ok, err := setIfFence.Run(ctx, g.rdb, []string{vkey, vkey + ":fence"},
			strconv.FormatInt(fence, 10), frame, g.jitter(ttl).Milliseconds()).Int()
		switch {
		case err != nil:
			// The result is good; only caching it failed. Serve it.
			g.redisError(ctx, "write", err)
		case ok == 0:
			g.stats.staleWrites.Add(1)
			return loader.ErrFenceLost
		}
		return nil
	}
	loadOnce := func(ctx context.Context, fence int64) error {
		ctx, cancel := context.WithTimeout(ctx, g.opts.LoadTimeout)
		defer cancel()
		g.stats.loads.Add(1)
		val, err := load(ctx, id)
		if errors.Is(err, ErrNotFound) {
			res, loadErr = flight{outcome: outLoaded}, ErrNotFound
			return write(ctx, fence, codec.Empty(), g.opts.EmptyTTL)
		}
		if err != nil {
			g.stats.loadErrors.Add(1)
			res, loadErr = flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: load: %w", g.name, id, err)
			return loadErr
		}
		frame, err := codec.Encode(g.opts.Codec, val)
		if err != nil {
			g.stats.loadErrors.Add(1)
			res, loadErr = flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", g.name, id, err)
			return loadErr
		}
		res, loadErr = flight{frame: frame, outcome: outLoaded}, nil
		return write(ctx, fence, frame, g.opts.TTL)
	}
	err := g.coord.Run(ctx, vkey, check, loadOnce)
	switch {
	case err == nil:
		return res, loadErr // loadErr is ErrNotFound after a marker write
	case errors.Is(err, loader.ErrFenceLost):
		// Invalidated again and again until LockWait: serve the freshest
		// load, uncached.
		return res, loadErr
	case errors.Is(err, loader.ErrBusy):
		return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w", g.name, id, ErrBusy)
	case err != nil && res.outcome == 0:
		g.redisError(ctx, "lock", err)
		return flight{outcome: outFailed}, fmt.Errorf("cacheguard: %s %q: %w: %w", g.name, id, ErrUnavailable, err)
	}
	return res, err
}

func (g *Guard) dropCorrupt(ctx context.Context, vkey string, raw []byte, why error) {
	g.stats.corrupt.Add(1)
	g.log.WarnContext(ctx, "cacheguard: dropping corrupt cache entry", "key", vkey, "err", why)
	if err := delIfEqual.Run(ctx, g.rdb, []string{vkey}, raw).Err(); err != nil {
		g.redisError(ctx, "delete corrupt entry", err)
	}
}

func (g *Guard) redisError(ctx context.Context, op string, err error) {
	g.stats.redisErrors.Add(1)
	g.log.WarnContext(ctx, "cacheguard: redis "+op+" failed", "err", err)
	// A cluster client re-reads the slot map on MOVED replies, or when it is
	// ten seconds old; a pipeline to a dead master gets no MOVED and can go
	// on failing for close to a minute after a failover. A network error
	// makes us ask for a reload (at most once a second).
	var ne net.Error
	if cc, ok := g.rdb.(*redis.ClusterClient); ok && errors.As(err, &ne) {
		now, last := time.Now().UnixNano(), g.lastSlotReload.Load()
		if now-last > int64(time.Second) && g.lastSlotReload.CompareAndSwap(last, now) {
			cc.ReloadState(ctx)
		}
	}
}

// jitter returns d spread uniformly over d·(1 ± Jitter), at least 1ms.
func (g *Guard) jitter(d time.Duration) time.Duration {
	if j := g.opts.Jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d, time.Millisecond)
}

// MayExist asks only the bloom filter whether id may exist: false means the
// ID certainly does not (one GETRANGE). HTTP middleware uses Peek instead,
// which also reads the cache for the handler's Get. A malformed ID gives
// ErrInvalidKey without a Redis command; a filter that is not ready answers
// true (fail open); Redis failures wrap ErrUnavailable.
func (g *Guard) MayExist(ctx context.Context, id string) (bool, error) {
	if _, err := g.keys.value(id); err != nil {
		return false, err
	}
	maybe, err := g.bloom.Test(ctx, id)
	if maybe, err = g.filterSays(ctx, id, maybe, err); err == nil && !maybe {
		g.stats.rejects.Add(1)
	}
	return maybe, err
}

// Add registers newly created IDs in the bloom filter. Call it after the
// source of truth has committed them, before they are read: one round trip
// (two while a rebuild runs; see bloom.Filter.AddMany). Malformed IDs make Add fail before any Redis command.
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
//
// It also deletes each ID's fence, so a load that read the old data before
// the change and is still running cannot write it afterwards: its fenced
// write is refused and it loads again. New callers in this process start a
// new flight instead of joining one that may have read the old data.
func (g *Guard) Invalidate(ctx context.Context, ids ...string) error {
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		k, err := g.keys.value(id)
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
		pipe.Del(ctx, k, k+":fence")
		pipe.Publish(ctx, g.keys.prefix+"invalidated", k)
	}
	_, err := pipe.Exec(ctx)
	for _, k := range keys {
		g.flights.Forget(k)
		if g.local != nil {
			g.local.epoch.Add(1)
			g.local.drop(k)
		}
	}
	if err != nil {
		g.redisError(ctx, "invalidate", err)
		return fmt.Errorf("cacheguard: %s: invalidate: %w", g.name, err)
	}
	return nil
}

// Rebuild replaces the bloom filter with one built from every existing ID of
// the source of truth, and lets it answer "absent". Run it when a Guard is
// first deployed, when Redis has lost the filter (or set RebuildFrom), now and
// then to clear the bits of deleted IDs, and to resize it. Until the first
// Rebuild, Get fails open (counted in Stats.BloomBypasses). No existing ID is
// reported absent at any moment of a rebuild (see package bloom). opts may be
// nil.
func (g *Guard) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *bloom.RebuildOptions) (int, error) {
	n, err := g.bloom.Rebuild(ctx, ids, opts)
	if err != nil {
		return n, fmt.Errorf("cacheguard: %s: %w", g.name, err)
	}
	return n, nil
}
