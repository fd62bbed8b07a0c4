package guard

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"context"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/loader"
)

// Options configures a Guard. A nil *Options means all defaults; a zero field
// means that field's default.
type Options struct {
	// KeyPrefix starts every Redis key and channel of the Guard:
	// "<KeyPrefix>:<name>:...", so a Redis ACL of "~<KeyPrefix>:*
	// &<KeyPrefix>:*" covers them all (see README, "Redis ACL"). Default
	// "cg". Printable ASCII without spaces, braces or glob characters
	// (*?[]\).
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
	// StrictSizing makes New fail with bloom.ErrMismatch when the filter in
	// Redis was sized otherwise (say, resized by a Rebuild). By default New
	// adopts the stored layout and logs it once.
	StrictSizing bool
	// MaxKeyLen caps an ID's length in bytes. Default 128; at most 4096.
	// The HTTP adapters follow it.
	MaxKeyLen int
	// Codec encodes cached values. Default codec.Msgpack.
	Codec codec.Codec
	// Version names the schema of the cached values (1 to 32 printable
	// ASCII bytes, no spaces). Each ID's entry is a Redis hash with one
	// field per version, so during a rolling deploy the processes on the old
	// struct and those on the new one read and write their own field
	// instead of evicting each other, while every write (Invalidate, Set,
	// Delete) drops all versions of the ID at once. Bump it with a change to
	// the value type that the codec cannot read across; no flush is needed
	// (old fields go with their entries' TTL). Default "1".
	Version string
	// LoadTimeout bounds a load, on a context detached from the callers',
	// even if the load function ignores its ctx: a load still running then
	// fails the Get and its late result is dropped. Default 10 seconds.
	LoadTimeout time.Duration
	// RedisTimeout bounds each Redis round trip that a fill flight makes
	// on its own (lock, re-check, write, release, wait), so that a stalled
	// Redis cannot keep flights alive: a flight ends within LockWait +
	// LoadTimeout + 4·RedisTimeout. A Get's own read is bounded by its ctx
	// (see README: ContextTimeoutEnabled); a round trip that carries other
	// Gets' reads too (ReadsInFlight) is bounded by RedisTimeout, and so,
	// with Local, is the read that the callers of an ID share. Default 1
	// second.
	RedisTimeout time.Duration
	// ReadsInFlight caps the round trips of reads that a Guard's Gets have
	// under way at once. A Get that finds them all busy waits for one to
	// end, and goes with every other Get that waited, in the next one: a
	// single pipeline, in which each read is still its own command (a hit
	// is one HGET). Under load many hits share a round trip, which cuts
	// the system calls and Redis event-loop turns per hit several times
	// over; with no contention each Get sends its own read at once, as
	// without batching. Default 2; a negative value turns batching off.
	ReadsInFlight int
	// Outage says what Get does when Redis cannot answer; nil means the
	// defaults of OutageOptions (load through, capped).
	Outage *OutageOptions
	// RefreshAhead, if set, refreshes values in the background before they
	// expire, serving them meanwhile (see RefreshOptions). Off by default.
	RefreshAhead *RefreshOptions
	// LockTTL is the lease of an ID's load lock. A watchdog renews it while
	// the load runs, so it only matters when a loading process dies: the
	// others take over about LockTTL later. Default loader.DefaultLockTTL
	// (5 seconds); at least 10ms.
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
	// Logger receives warnings (filter bypassed, corrupt entries, Redis
	// failures). Default: no logging.
	Logger *slog.Logger
	// TracerProvider and MeterProvider turn on OpenTelemetry: spans for
	// Get, GetMany, loads and lock waits, and the cacheguard.* metrics (see
	// telemetry.go for the list). The application brings the SDK; pass
	// otel.GetTracerProvider() and otel.GetMeterProvider() to use the
	// global ones. Nil, the default: nothing is recorded, at no cost.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// resolve fills in the defaults: the one place where a Guard's defaults are
// decided (the loader's come from its exported constants).
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
	if !keyspace.ValidPrefix(o.KeyPrefix) {
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
	if o.Version == "" {
		o.Version = "1"
	}
	if !validVersion(o.Version) {
		return bad("Version %q (want 1-32 printable ASCII bytes, no spaces)", o.Version)
	}
	if o.LoadTimeout == 0 {
		o.LoadTimeout = 10 * time.Second
	}
	if o.RedisTimeout == 0 {
		o.RedisTimeout = time.Second
	}
	if o.RedisTimeout < time.Millisecond {
		return bad("RedisTimeout %v below 1ms", o.RedisTimeout)
	}
	if o.ReadsInFlight == 0 {
		o.ReadsInFlight = 2
	}
	if o.Outage == nil {
		o.Outage = &OutageOptions{}
	}
	var err error
	if o.RefreshAhead, err = resolveRefresh(o.RefreshAhead); err != nil {
		return Options{}, err
	}
	if o.LockTTL == 0 {
		o.LockTTL = loader.DefaultLockTTL
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

func validVersion(v string) bool {
	if v == "" || len(v) > 32 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
