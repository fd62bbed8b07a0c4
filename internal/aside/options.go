package aside

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/coord"
	"github.com/cacheguard/cacheguard/internal/keyspace"
)

// Options is guard.Options (documented there); resolve fills in its
// defaults.
type Options struct {
	KeyPrefix    string
	TTL          time.Duration
	EmptyTTL     time.Duration
	Jitter       float64
	Codec        codec.Codec
	Version      string
	Logger       *slog.Logger
	LoadTimeout  time.Duration
	Filter       FilterOptions    // the bloom filter: sizing and its ID source
	Outage       *OutageOptions   // what Get does when Redis cannot answer (nil: load through)
	RefreshAhead *RefreshOptions  // reload hot values before they expire (nil: off)
	Local        *LocalOptions    // keep values in process memory too (nil: off)
	Telemetry    TelemetryOptions // OpenTelemetry (off by default)
	Tuning       Tuning           // knobs that rarely need turning
}

// FilterOptions is guard.FilterOptions.
type FilterOptions struct {
	ExpectedItems     uint64
	FalsePositiveRate float64
	IDs               func(ctx context.Context) iter.Seq2[string, error]
	NoLocalCopy       bool
}

// TelemetryOptions is guard.TelemetryOptions.
type TelemetryOptions struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Tuning is guard.Tuning.
type Tuning struct {
	LockTTL       time.Duration
	LockWait      time.Duration
	LoadOnBusy    bool
	RedisTimeout  time.Duration
	ReadsInFlight int
	MaxKeyLen     int
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
	if o.Tuning.MaxKeyLen == 0 {
		o.Tuning.MaxKeyLen = DefaultMaxKeyLen
	}
	if o.Tuning.MaxKeyLen < 1 || o.Tuning.MaxKeyLen > 4096 {
		return bad("MaxKeyLen %d not in [1, 4096]", o.Tuning.MaxKeyLen)
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
	if o.Tuning.RedisTimeout == 0 {
		o.Tuning.RedisTimeout = time.Second
	}
	if o.Tuning.RedisTimeout < time.Millisecond {
		return bad("RedisTimeout %v below 1ms", o.Tuning.RedisTimeout)
	}
	if o.Tuning.ReadsInFlight == 0 {
		o.Tuning.ReadsInFlight = 2
	}
	if o.Outage == nil {
		o.Outage = &OutageOptions{}
	}
	var err error
	if o.RefreshAhead, err = resolveRefresh(o.RefreshAhead); err != nil {
		return Options{}, err
	}
	if o.Tuning.LockTTL == 0 {
		o.Tuning.LockTTL = coord.DefaultLockTTL
	}
	if o.Tuning.LockWait == 0 {
		o.Tuning.LockWait = o.LoadTimeout + o.Tuning.LockTTL
	}
	if o.LoadTimeout < 0 || o.Tuning.LockTTL < 10*time.Millisecond || o.Tuning.LockWait < 0 {
		return bad("LoadTimeout %v, LockTTL %v (>= 10ms), LockWait %v", o.LoadTimeout, o.Tuning.LockTTL, o.Tuning.LockWait)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
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

// DefaultMaxKeyLen is Tuning.MaxKeyLen's default.
const DefaultMaxKeyLen = 128
