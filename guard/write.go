package guard

import (
	"context"
	"iter"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/aside"
)

// Add makes newly created IDs servable at once, in every process. Call it
// after the source of truth has committed them. It registers them in the
// bloom filter, drops their empty markers (an ID asked for before it
// existed, a bloom false positive, a deleted and re-created ID), and voids
// any load in flight that read "absent" before the create and would write a
// marker after it (it deletes the ID's load lock, as Invalidate does). A
// cached value is never dropped. One round trip for any number of IDs (two
// while a filter rebuild runs; see bloom.Filter.AddMany). Malformed IDs make
// Add fail before any Redis command; Redis failures wrap ErrUnavailable,
// and the write is replayed (see Stats.Unwritten). Each write waits for
// Redis at most Tuning.RedisTimeout, whatever ctx.
func (g *Guard) Add(ctx context.Context, ids ...string) error { return g.e.Add(ctx, ids...) }

// Set writes v as the cached value of id: write-through, after the source of
// truth committed it. In one round trip it replaces the ID's entry (all
// schema versions) with v for TTL ± Jitter, registers the ID in the bloom
// filter, and voids every load in flight, so that no slower load that read
// older data can overwrite it; every process's in-memory copy
// (Options.Local) is replaced here and dropped elsewhere.
//
// Two Sets of one ID racing each other: the last to reach Redis wins. Make
// sure that is also the order of their commits (for example, Set inside the
// same critical section or row lock as the database write), or call
// Invalidate instead, which never caches anything it did not read. A Set
// that cannot reach Redis within RedisTimeout wraps ErrUnavailable and is
// replayed (as an Invalidate; see Stats.Unwritten).
func Set[T any](ctx context.Context, g *Guard, id string, v T) error {
	if g == nil {
		return errNil("Set")
	}
	return aside.Set(ctx, g.e, id, v)
}

// Delete records that ids no longer exist, after the source of truth deleted
// them: in one round trip each ID's entry (all schema versions) becomes an
// empty marker for EmptyTTL ± Jitter, loads in flight are voided, and
// in-memory copies (Options.Local) are dropped in every process. The next Get
// of a deleted ID, in any process, answers ErrNotFound without calling the
// loader. A re-created ID is servable again after its Add. A Delete that
// cannot reach Redis within RedisTimeout wraps ErrUnavailable and is
// replayed (as an Invalidate).
func (g *Guard) Delete(ctx context.Context, ids ...string) error { return g.e.Delete(ctx, ids...) }

// Invalidate drops the cached values and empty markers of ids (all schema
// versions), so the next Get loads them again. Call it after the source of
// truth has changed them (or use Set to write the new value through, or
// Delete for deleted IDs).
//
// It also deletes each ID's load lock, so a load that read the old data
// before the change and is still running cannot write it afterwards: its
// write checks that the lock still holds its token, is refused, and it
// loads again (or waits for a load that started after the change). New
// callers in this process start a new flight instead of joining one that
// may have read the old data, and every process's in-memory copy
// (Options.Local) is dropped. One round trip. An Invalidate that cannot
// reach Redis within RedisTimeout wraps ErrUnavailable and is replayed (see
// Stats.Unwritten).
func (g *Guard) Invalidate(ctx context.Context, ids ...string) error {
	return g.e.Invalidate(ctx, ids...)
}

// InvalidateAll invalidates every ID of the Guard that has an entry or a
// load in flight, in every process, as Invalidate does each: after a
// TRUNCATE or a bulk change that no list of IDs describes. Two SCAN passes
// on every master make sure that no load which read the old data before
// the call caches it after. It returns how many IDs it invalidated and
// leaves the filter as it is (see Rebuild). Redis failures wrap
// ErrUnavailable and are not replayed: call it again.
func (g *Guard) InvalidateAll(ctx context.Context) (int, error) { return g.e.InvalidateAll(ctx) }

// Rebuild replaces the bloom filter with one built from every existing ID of
// the source of truth, and lets it answer "absent". With Options.Filter.IDs
// the Guard does it by itself whenever the filter is not ready; call it to
// resize the filter, to clear the bits of deleted IDs, or without an ID
// source. Until then Get fails open (Stats.BloomBypasses). No existing ID is
// reported absent during a rebuild. It waits for this Guard's automatic
// rebuild, if one runs; if it fails and Filter.IDs is set, the Guard goes
// on trying in the background. opts may be nil.
func (g *Guard) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *bloom.RebuildOptions) (int, error) {
	return g.e.Rebuild(ctx, ids, opts)
}

// Info describes the Guard's bloom filter as it is in Redis (see bloom.Info;
// it counts bits, so keep it off the request path).
func (g *Guard) Info(ctx context.Context) (bloom.Info, error) { return g.e.Info(ctx) }

// IDs makes a slice a source for Rebuild (and Options' ID source).
func IDs(ids []string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for _, id := range ids {
			if !yield(id, nil) {
				return
			}
		}
	}
}
