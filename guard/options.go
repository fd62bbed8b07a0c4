package guard

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/loader"
)

// Options configures a Guard. A nil *Options means all defaults; a zero field
// means that field's default. The common settings come first; the rest are
// grouped by concern. docs/behaviour.md explains each in full.
type Options struct {
	// KeyPrefix starts every Redis key and channel of the Guard (an ACL of
	// "~<KeyPrefix>:* &<KeyPrefix>:*" covers them). Default "cg".
	KeyPrefix string
	// TTL of a cached value, before jitter. Default 10 minutes.
	TTL time.Duration
	// EmptyTTL of a "not found" marker, before jitter. Default 1 minute.
	EmptyTTL time.Duration
	// Jitter spreads TTLs over ±Jitter·TTL. Default 0.10; negative: none.
	Jitter float64
	// Codec encodes cached values. Default codec.Msgpack. Each shape of
	// the value type (its fields, their types and tags) has its own entries
	// (codec.Shape); a codec may opt out (codec.Shaper).
	Codec codec.Codec
	// Version names what the values mean: bump it when a field keeps its
	// name and type but changes meaning (Price now in cents). Each version
	// has its own entries, so two releases can share a Redis. Default "1".
	Version string
	// Logger receives warnings (Redis failures, a filter that is off,
	// corrupt entries), each cause once per 10 s with a count. Default
	// slog.Default(); pass slog.New(slog.DiscardHandler) for none.
	Logger *slog.Logger
	// LoadTimeout bounds a load even if it ignores its ctx; a late result
	// is dropped. Default 10 seconds.
	LoadTimeout time.Duration

	Filter       FilterOptions    // the bloom filter: sizing and its ID source
	Outage       *OutageOptions   // what Get does when Redis cannot answer (nil: load through)
	RefreshAhead bool             // reload hot values before they expire (refresh.go)
	Local        *LocalOptions    // keep values in process memory too (nil: off)
	Telemetry    TelemetryOptions // OpenTelemetry (off by default)
	Tuning       Tuning           // knobs that rarely need turning
}

// FilterOptions sizes the bloom filter and names where its IDs come from.
type FilterOptions struct {
	// ExpectedItems sizes the filter when this Guard creates it. Default
	// 1,000,000. A filter that exists keeps its stored sizing (a WARN says
	// so when these fields ask for another); Rebuild resizes it.
	ExpectedItems uint64
	// FalsePositiveRate is the target at ExpectedItems, in (0, 0.5].
	// Default 0.01.
	FalsePositiveRate float64
	// IDs lists every existing ID from the source of truth: a filter that
	// is not ready (never built, lost by Redis) is rebuilt from it in the
	// background. Without it, call Rebuild yourself.
	IDs func(ctx context.Context) iter.Seq2[string, error]
	// NoLocalCopy keeps no copy of the filter in process memory (it takes
	// the filter's size). With the copy, while the filter is not ready or
	// Redis cannot answer, an ID it has never seen (a row created since in
	// another process too) is answered ErrUnconfirmed, a 503, not loaded.
	// Without it, such IDs load through (fail open). docs/operations.md.
	NoLocalCopy bool
}

// TelemetryOptions turns on OpenTelemetry spans and cacheguard.* metrics.
// The application brings the SDK; nil providers record nothing, at no cost.
type TelemetryOptions struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Tuning holds knobs that the defaults serve well; docs/behaviour.md says
// when to turn them.
type Tuning struct {
	// LockTTL is the lease of an ID's load lock (renewed while the load
	// runs): when a loader dies, others take over after it. Default 5s.
	LockTTL time.Duration
	// LockWait bounds a wait for another process's load before ErrBusy.
	// Default LoadTimeout + LockTTL.
	LockWait time.Duration
	// LoadOnBusy loads (uncached) instead of returning ErrBusy.
	LoadOnBusy bool
	// RedisTimeout bounds each Redis round trip a flight makes on its
	// own, and a Peek's or a write's wait for Redis whatever their ctx (an
	// HTTP request's has no deadline). Default 1 second.
	RedisTimeout time.Duration
}

// resolve fills in the defaults: the one place where a Guard's defaults are
// decided (LockTTL's is loader.DefaultLockTTL; the Coordinator is given each
// value resolved here, so loader's own defaults never apply to a Guard).
func resolve(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	bad := func(format string, args ...any) (Options, error) {
		return Options{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
	}
	o.KeyPrefix = cmp.Or(o.KeyPrefix, "cg")
	if !keyspace.ValidPrefix(o.KeyPrefix) {
		return bad("KeyPrefix %q", o.KeyPrefix)
	}
	o.TTL = cmp.Or(o.TTL, 10*time.Minute)
	o.EmptyTTL = cmp.Or(o.EmptyTTL, time.Minute)
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
	o.Codec = cmp.Or(o.Codec, codec.Msgpack)
	o.Version = cmp.Or(o.Version, "1")
	if !validVersion(o.Version) {
		return bad("Version %q (want 1-32 printable ASCII bytes, no spaces)", o.Version)
	}
	o.LoadTimeout = cmp.Or(o.LoadTimeout, 10*time.Second)
	o.Tuning.RedisTimeout = cmp.Or(o.Tuning.RedisTimeout, time.Second)
	if o.Tuning.RedisTimeout < time.Millisecond {
		return bad("RedisTimeout %v below 1ms", o.Tuning.RedisTimeout)
	}
	if o.Outage == nil {
		o.Outage = &OutageOptions{}
	}
	o.Tuning.LockTTL = cmp.Or(o.Tuning.LockTTL, loader.DefaultLockTTL)
	o.Tuning.LockWait = cmp.Or(o.Tuning.LockWait, o.LoadTimeout+o.Tuning.LockTTL)
	if o.LoadTimeout < 0 || o.Tuning.LockTTL < 10*time.Millisecond || o.Tuning.LockWait < 0 {
		return bad("LoadTimeout %v, LockTTL %v (>= 10ms), LockWait %v", o.LoadTimeout, o.Tuning.LockTTL, o.Tuning.LockWait)
	}
	o.Logger = cmp.Or(o.Logger, slog.Default())
	return o, nil
}

// validVersion: 1 to 32 printable ASCII bytes, no spaces.
func validVersion(v string) bool {
	return v != "" && len(v) <= 32 && !strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f })
}
