package loader

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/coord"
)

// ErrBusy: another process held the key's lock for longer than LockWait.
var ErrBusy = coord.ErrBusy

// Filler is what a Coordinator fills a key for.
type Filler interface {
	// Cached is given what the cache holds under the key's field; it
	// reports whether that answers the call (false: load, e.g. corrupt).
	Cached(ctx context.Context, raw []byte) bool
	// Load loads the key's value; what it returns is written under the
	// key's field for ttl if the holder's lock is still its own.
	Load(ctx context.Context) (frame []byte, ttl time.Duration, err error)
}

// CoordinatorOptions tunes a Coordinator. A nil pointer means defaults.
type CoordinatorOptions struct {
	// LockTTL is the lease of a key's lock, renewed every LockTTL/3 while
	// the load runs: when a holder dies, others take over after it.
	// Default 5 seconds.
	LockTTL time.Duration
	// LockWait bounds a wait for other processes' loads of the key before
	// Run returns ErrBusy. Default 15 seconds.
	LockWait time.Duration
}

// Coordinator makes one process at a time load a key, across all processes
// that share a Redis and a channel, and wakes the others when it is done.
// A key is a Redis hash and each fill writes one field of it, so that
// writers of several schema versions keep their own fields.
type Coordinator struct{ c *coord.Coordinator }

// NewCoordinator returns a Coordinator that publishes on channel. Close it
// to end its pub/sub subscription.
func NewCoordinator(rdb redis.UniversalClient, channel string, opts *CoordinatorOptions) *Coordinator {
	var o coord.Options
	if opts != nil {
		o.LockTTL, o.LockWait = opts.LockTTL, opts.LockWait
	}
	return &Coordinator{c: coord.New(rdb, channel, &o)}
}

// Run fills field of key once across processes: the process that takes
// the key's lock re-checks the cache, loads, and writes the frame only if
// the lock is still its own (a write elsewhere that deleted the lock makes
// it load again); the others wait for its publish and read the field. It
// returns nil when f answered, the load's error, ErrBusy, ctx's error, or
// a Redis error wrapping ErrUnavailable (package lock's).
func (c *Coordinator) Run(ctx context.Context, key, field string, f Filler) error {
	return c.c.Run(ctx, key, field, f)
}

// Close ends the Coordinator's subscription; Runs after Close fail.
func (c *Coordinator) Close() error { return c.c.Close() }
