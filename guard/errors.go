package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/loader"
)

var (
	// ErrNotFound: the ID does not exist in the source of truth (the bloom
	// filter has never seen it, an empty marker is cached, or load said so).
	// A loader reports absence by returning an error that wraps ErrNotFound.
	ErrNotFound = errors.New("cacheguard: not found")
	// ErrInvalidKey: the ID is empty, longer than 4,096 bytes or holds
	// control bytes. No Redis command was sent.
	ErrInvalidKey = keyspace.ErrInvalidKey
	// ErrLoaderPanic is wrapped by the error callers get when load panicked
	// (the panic value and stack follow in the message).
	ErrLoaderPanic = errors.New("cacheguard: load panicked")
	// ErrInvalidOptions: New was given a bad name or option.
	ErrInvalidOptions = errors.New("cacheguard: invalid options")
	// ErrBusy: another process was loading the ID for longer than LockWait.
	ErrBusy = errors.New("cacheguard: busy: another process is still loading the ID")
	// ErrWrongType: the Guard is bound to another value type (by its first
	// Get or For): one Guard serves one type.
	ErrWrongType = errors.New("cacheguard: wrong type")
	// ErrClosed: the Guard was closed.
	ErrClosed = errors.New("cacheguard: guard closed")
	// ErrUnavailable is wrapped, with the Redis error, by every error that
	// Redis failing to answer causes in every package of cacheguard (the same
	// value as bloom's and lock's): a dial or I/O error, a timeout, an error
	// reply (OOM, NOPERM). Retry later, or serve from the source of truth.
	ErrUnavailable = redisfail.ErrUnavailable
	// ErrUnconfirmed: Redis cannot answer, or its bloom filter is not ready,
	// and this process's copy of the filter has never seen the ID. Another
	// process may have created it since the copy, so it is neither loaded
	// nor answered ErrNotFound. It wraps ErrUnavailable: retry later (503).
	// FilterOptions.NoLocalCopy turns it off.
	ErrUnconfirmed = fmt.Errorf("cacheguard: not in this process's copy of the bloom filter, and redis cannot confirm it: %w",
		ErrUnavailable)
)

// fail is the one exit of every error from the Guard's Redis work: a Redis
// failure (an error wrapping ErrUnavailable: bloom, lock and loader wrap
// theirs, redisfail.Wrap the Guard's own commands) is counted in
// Stats.RedisErrors and logged, once, here. The error comes back named after
// the Guard, the operation and the ID (if any).
func (g *Guard) fail(ctx context.Context, op, id string, err error) error {
	if err == nil {
		return nil
	}
	who, attrs := g.name, []any{"err", err}
	if id != "" {
		who, attrs = fmt.Sprintf("%s %q", g.name, id), []any{"id", id, "err", err}
	}
	if errors.Is(err, ErrUnavailable) {
		g.stats.redisErrors.Add(1)
		g.log.WarnContext(ctx, "cacheguard: redis "+op+" failed", attrs...)
		g.reloadSlots(ctx, err)
	}
	return fmt.Errorf("cacheguard: %s: %s: %w", who, op, err)
}

// one is the ID a write of ids is about, or "" when it is about several.
func one(ids []string) string {
	if len(ids) == 1 {
		return ids[0]
	}
	return ""
}

// idOf is the ID whose value key vkey is, for log lines ("" if none).
func (g *Guard) idOf(vkey string) string {
	id, _ := g.keys.ID(vkey)
	return id
}

// reloadSlots asks a cluster client to re-read its slot map after a network
// error. A cluster client re-reads it on MOVED replies, or when it is ten
// seconds old; a pipeline to a dead master gets no MOVED and can go on
// failing for close to a minute after a failover. At most once a second.
func (g *Guard) reloadSlots(ctx context.Context, err error) {
	var ne net.Error
	if cc, ok := g.rdb.(*redis.ClusterClient); ok && errors.As(err, &ne) {
		now, last := time.Now().UnixNano(), g.outage.lastSlotReload.Load()
		if now-last > int64(time.Second) && g.outage.lastSlotReload.CompareAndSwap(last, now) {
			cc.ReloadState(ctx)
		}
	}
}

// panicked turns a flight's panic into an error wrapping ErrLoaderPanic;
// other errors come back as they are.
func panicked(g *Guard, id string, err error) error {
	if errors.Is(err, loader.ErrPanic) {
		what := strings.TrimPrefix(err.Error(), loader.ErrPanic.Error()+": ") // the value and its one stack
		return panicError{msg: fmt.Sprintf("%v: %s %q: %s", ErrLoaderPanic, g.name, id, what), err: err}
	}
	return err
}

// panicError says "load panicked" once and wraps both ErrLoaderPanic and
// the flight's loader.ErrPanic.
type panicError struct {
	msg string
	err error
}

func (e panicError) Error() string   { return e.msg }
func (e panicError) Unwrap() []error { return []error{ErrLoaderPanic, e.err} }
