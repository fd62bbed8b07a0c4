package guard

import (
	"context"

	"github.com/cacheguard/cacheguard/internal/aside"
)

// LoadFunc loads the value of id from the source of truth. It reports an ID
// that does not exist with an error wrapping ErrNotFound (for example
// fmt.Errorf("%w: %w", guard.ErrNotFound, sql.ErrNoRows)); any other error
// fails the Get and is not cached.
type LoadFunc[T any] func(ctx context.Context, id string) (T, error)

// BatchLoadFunc loads the values of ids from the source of truth, for
// GetMany. An ID missing from the map does not exist (it gets an empty
// marker); an error fails every ID of the call and nothing is cached.
type BatchLoadFunc[T any] func(ctx context.Context, ids []string) (map[string]T, error)

// Get returns the value of id: from the cache, or from load on a miss (see
// the package doc for the steps). It returns ErrNotFound (test with
// errors.Is) when the ID does not exist, ErrInvalidKey for a malformed ID,
// the load's error wrapped when load fails, ErrBusy, ErrClosed, ErrWrongType
// when g is bound to another type, and errors wrapping ErrUnavailable when
// Redis fails (never ErrNotFound). load runs on a context detached from ctx
// and bounded by LoadTimeout, shared by every caller of id in this process
// whose Get started before the load did; Get itself returns as soon as ctx
// is done.
func Get[T any](ctx context.Context, g *Guard, id string, load LoadFunc[T]) (T, error) {
	if g == nil || load == nil {
		var zero T
		return zero, errNil("Get")
	}
	if g.e.Traced() {
		return aside.GetTraced(ctx, g.e, id, aside.LoadFunc[T](load))
	}
	return aside.Get(ctx, g.e, id, aside.LoadFunc[T](load))
}

// GetMany returns the values of the ids that exist, in a map (an ID that
// does not exist is not in it), for list pages and joins. One round trip
// reads every ID's entry (with the bloom probes while reads miss; on a
// cluster, each node its share in parallel): a warm page costs that alone.
// The misses are loaded once per ID across processes, and those whose lock
// this call takes load together in one call of load; IDs it does not return
// get "not found" markers. With Options.Local, memory answers first.
// Malformed IDs fail the call with ErrInvalidKey; if some IDs fail, the map
// holds the others and the error joins the failures. When Redis cannot
// answer, the misses load through in one call.
func GetMany[T any](ctx context.Context, g *Guard, ids []string, load BatchLoadFunc[T]) (map[string]T, error) {
	if g == nil || load == nil {
		return nil, errNil("GetMany")
	}
	return aside.GetMany(ctx, g.e, ids, aside.BatchLoadFunc[T](load))
}

// Peek does Get's read round trip (bloom probe and cache GET) without
// loading, and reports whether id may exist: false when the filter has never
// seen it or an empty marker is cached. It returns a context that carries
// what it read, so that the next Get of the same id on this Guard with that
// context (or one derived from it) skips its own read: HTTP middleware built
// on Peek costs no extra round trip. Only that one Get uses it; any later Get
// reads afresh (say, after the handler wrote and invalidated). A malformed id
// gives ErrInvalidKey without a Redis command; Redis failures wrap
// ErrUnavailable; after Close, ErrClosed. A filter that is not ready answers
// true (fail open). Before the Guard's first Get it asks the filter alone.
// It waits for Redis at most Tuning.RedisTimeout whatever ctx; when Redis
// did not answer, the context it returns makes that Get load through at
// once rather than wait for Redis again.
func (g *Guard) Peek(ctx context.Context, id string) (context.Context, bool, error) {
	return g.e.Peek(ctx, id)
}

// MayExist asks only the bloom filter whether id may exist: false means the
// ID certainly does not (one GETRANGE). HTTP middleware uses Peek instead,
// which also reads the cache for the handler's Get. A malformed ID gives
// ErrInvalidKey without a Redis command; a filter that is not ready answers
// true (fail open); Redis failures wrap ErrUnavailable; after Close,
// ErrClosed.
func (g *Guard) MayExist(ctx context.Context, id string) (bool, error) {
	return g.e.MayExist(ctx, id)
}
