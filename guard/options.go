package guard

import (
	"context"
	"iter"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/aside"
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
	RefreshAhead *RefreshOptions  // reload hot values before they expire (nil: off)
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
	// the filter's size: docs/incidents.md). With the copy, while the filter is not
	// ready or Redis cannot answer, an ID it has never seen is answered
	// ErrUnconfirmed (a 503), not loaded: a row created in another process
	// since the copy answers so too, until the filter is back. Without it,
	// such IDs load through (fail open). docs/incidents.md.
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
	// ReadsInFlight caps concurrent read round trips; reads that wait go
	// together in one pipeline. Default 2; negative: no batching.
	ReadsInFlight int
	// MaxKeyLen caps an ID's length in bytes (the HTTP adapters follow
	// it). Default 128; at most 4096.
	MaxKeyLen int
}

// OutageOptions says what Get does when Redis cannot answer: it is down,
// times out, refuses writes under maxmemory, or an ACL refuses a command.
//
// By default Get loads through: it calls the load function directly and
// returns its value (or ErrNotFound) uncached, merged per ID in the process
// and capped across IDs by MaxLoads; a Get beyond the cap gets ErrUnavailable
// at once. Load-through is the default because the cache exists to spare the
// database, not to refuse its readers (the HTTP adapters fail open too). The
// filter is in Redis as well: unknown IDs are judged by the Guard's copy of
// it (FilterOptions.NoLocalCopy), and reach the loader, within the cap, only
// when that copy may hold them. A circuit breaker (sony/gobreaker) opens
// after 5 failed reads in a row, keeps Gets off Redis for a second, then
// lets one probe.
type OutageOptions struct {
	// FailFast makes Get return ErrUnavailable (wrapped) instead of loading
	// through.
	FailFast bool
	// MaxLoads caps the load-through calls in flight at once, across all
	// IDs of the Guard, per process. Default 16.
	MaxLoads int
}

// RefreshOptions turns on refresh-ahead (stale-while-revalidate for expiry):
// a value is written with a refresh-at time inside its TTL, and a Get that
// finds it past that time serves it at once and starts one refresh in the
// background, so callers of a hot key never wait for its load. One refresh
// per key per process at a time, and one across processes (it takes the
// key's lock once, without waiting: a process that finds the lock held
// leaves the refresh to its holder). The refresh's write checks its lock
// like a fill's, and the Redis TTL is the hard expiry: past it the key is a plain
// miss. Writes are never bypassed: Invalidate, Set and Delete replace or
// drop the entry, so after they return no Get serves the old value, and a
// refresh that read the old row is refused.
//
// Frames written with refresh-ahead carry the refresh-at time (a frame kind
// that versions before this one read as corrupt: turn it on together with a
// new Options.Version during a rolling deploy).
type RefreshOptions struct {
	// At is the share of a value's TTL after which a Get refreshes it, in
	// (0, 1): about 1/At loads per TTL, and (1−At)·TTL for the refresh to
	// land. Default 0.85.
	At float64
}

// LocalOptions turns on an in-process cache in front of Redis: values this
// process read or loaded are served from memory, with no round trip, for up
// to TTL, and never past their entry's TTL in Redis.
//
// This process sees its own writes at once: Invalidate, Set and Delete drop
// or replace its copy before they return. Other processes learn of a write
// from a message on the Guard's pub/sub channel, sent in the write's round
// trip: until it arrives (milliseconds) they may serve their copy, and TTL
// bounds what a lost message can leave stale. Without Local the guarantee is
// exact. docs/design-notes.md gives the measured window and alternatives.
//
// A local hit costs no decode for most types: a copy is kept decoded, and
// handed out as is (no slices, maps or pointers) or deep-copied per caller
// (internal/clone); other types are decoded on every hit.
type LocalOptions struct {
	// Size caps the values kept; when full, the eviction policy of
	// github.com/maypok86/otter/v2 (adaptive W-TinyLFU: it keeps what is
	// read often and recently) picks what goes. Default 10,000.
	Size int
	// TTL is how long a value is served from memory at most: a copy also
	// never outlives its entry's TTL in Redis. Default 1 second.
	TTL time.Duration
}

// engine is o in the engine's terms (nil stays nil: the defaults), which
// resolves and checks it (aside.New).
func (o *Options) engine() *aside.Options {
	if o == nil {
		return nil
	}
	return &aside.Options{
		KeyPrefix: o.KeyPrefix, TTL: o.TTL, EmptyTTL: o.EmptyTTL, Jitter: o.Jitter, Codec: o.Codec,
		Version: o.Version, Logger: o.Logger, LoadTimeout: o.LoadTimeout,
		Filter:       aside.FilterOptions(o.Filter),
		Outage:       (*aside.OutageOptions)(o.Outage),
		RefreshAhead: (*aside.RefreshOptions)(o.RefreshAhead),
		Local:        (*aside.LocalOptions)(o.Local),
		Telemetry:    aside.TelemetryOptions(o.Telemetry),
		Tuning:       aside.Tuning(o.Tuning),
	}
}
