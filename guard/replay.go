package guard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Failed writes: when Set, Delete, Invalidate or Add cannot reach Redis
// (not when the caller's ctx ended first) the ID is kept here. Until its
// write lands, this process's Gets of it load through, and a goroutine of
// the Guard replays it as soon as Redis answers, as the same safe write:
// the ID joins the filter, and its entries and load lock are deleted.
// Past maxUnwritten IDs the set overflows: every Get loads through until
// the held IDs are replayed and all the Guard's entries are deleted, and
// the filter is rebuilt from Filter.IDs (docs/operations.md).
const (
	maxUnwritten = 10_000
	replayBatch  = 1_000
)

// unwrittenAfter keeps ids if err says their write did not reach Redis,
// and starts the replay (a write that landed is remembered by its mark:
// lost.go). It returns err.
func (g *Guard) unwrittenAfter(ctx context.Context, ids []string, err error) error {
	if errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
		if h := g.holdUnwritten(ids, false); h.start {
			g.log.Warn("cacheguard: a write did not reach redis; this process loads those IDs through until it is replayed",
				"ids", h.added, "already_held", h.already, "past_capacity", h.past, "err", err)
			g.startReplay()
		}
	}
	return err
}

// held is what holdUnwritten did with the IDs it was given: added to the
// set, already in it (one replay covers both writes), or past its capacity
// (covered by dropping every entry), each ID counted once; start says that
// no replay runs yet (the caller logs why one starts, then startReplay).
type held struct {
	added, already, past int
	start                bool
}

// holdUnwritten adds ids to the unwritten set (with overflow, every ID: the
// Guard's entries are dropped) and counts what it did with them.
func (g *Guard) holdUnwritten(ids []string, overflow bool) held {
	u := &g.unw
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ids == nil {
		u.ids = map[string]uint64{}
	}
	if overflow {
		u.overflowed = true
		u.overflows++
	}
	var h held
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		_, ok := u.ids[id]
		switch {
		case ok:
			h.already++
		case len(u.ids) >= maxUnwritten:
			u.overflowed = true
			u.overflows++
			h.past++
			continue
		default:
			h.added++
		}
		u.seq++
		u.ids[id] = u.seq
	}
	u.n.Store(int64(len(u.ids)) + b2i(u.overflowed))
	h.start = !u.replaying
	u.replaying = true
	return h
}

// startReplay starts the replay of the unwritten set, after holdUnwritten
// said none runs.
func (g *Guard) startReplay() { g.retry(g.replayOnce, func() {}, g.unw.wake) }

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// replayOnce replays the unwritten IDs, replayBatch at a time (and, after an
// overflow, deletes the Guard's entries once the held IDs are replayed). It
// reports done when none is left; it then ends the replay under the mutex,
// so an ID kept after that starts a new one, and logs what it did. A failed round trip returns
// false: retry waits, then calls it again.
func (g *Guard) replayOnce(ctx context.Context) (done bool) {
	u := &g.unw
	for {
		u.mu.Lock()
		batch := make(map[string]uint64, min(len(u.ids), replayBatch))
		for id, seq := range u.ids {
			if len(batch) == replayBatch {
				break
			}
			batch[id] = seq
		}
		overflow := u.overflows // the overflows this pass covers, if it drops the entries
		dropAll := u.overflowed && len(batch) == len(u.ids)
		if len(batch) == 0 && !u.overflowed {
			u.replaying = false
			n, batches, dropped := u.replayedIDs, u.batches, u.droppedAll
			u.replayedIDs, u.batches, u.droppedAll = 0, 0, false
			u.mu.Unlock()
			g.log.Info("cacheguard: failed writes replayed", "ids", n, "batches", batches, "all_entries_dropped", dropped)
			return true
		}
		u.mu.Unlock()
		if !g.replayBatch(ctx, batch, dropAll) {
			return false
		}
		u.mu.Lock()
		u.replayed.Add(1) // before the IDs leave the set: see get
		for id, seq := range batch {
			if u.ids[id] == seq {
				delete(u.ids, id)
			}
		}
		if dropAll && u.overflows == overflow {
			u.overflowed = false
		}
		u.n.Store(int64(len(u.ids)) + b2i(u.overflowed))
		u.replayedIDs, u.batches, u.droppedAll = u.replayedIDs+len(batch), u.batches+1, u.droppedAll || dropAll
		u.mu.Unlock()
	}
}

// replayBatch replays batch's IDs and, with dropAll, deletes every entry of
// the Guard; it reports whether all of it reached Redis.
func (g *Guard) replayBatch(ctx context.Context, batch map[string]uint64, dropAll bool) bool {
	ctx, cancel := context.WithTimeout(ctx, 4*g.opts.Tuning.RedisTimeout)
	defer cancel()
	if err := g.rewrite(ctx, slices.Collect(maps.Keys(batch))); err != nil {
		return false
	}
	if dropAll {
		switch _, err := g.invalidateAll(ctx); {
		case g.refusal(err) != "": // refused (an ACL without +scan): waiting will not mend it
			g.log.Error("cacheguard: cannot drop the Guard's entries after writes were dropped; they are left to their TTL",
				"err", err)
		case err != nil:
			return false
		}
		if g.opts.Filter.IDs == nil {
			g.log.Error("cacheguard: writes past the replay's capacity were dropped; if IDs were created meanwhile, " +
				"call Rebuild: the filter may reject them")
		}
		g.bf.stale.Store(true)
		g.autoRebuild("writes dropped past the replay's capacity")
	}
	return true
}

// rewrite is the replay of ids' writes, in one round trip: they join the
// filter, and their entries and load locks are deleted, with the message
// that drops in-memory copies elsewhere.
func (g *Guard) rewrite(ctx context.Context, ids []string) error {
	keys, err := g.valueKeys(ids)
	if err != nil {
		return err
	}
	return g.admit(ctx, ids, keys)
}

var errUnwritten = fmt.Errorf("%w: this ID's last write did not reach redis and is not replayed yet", ErrUnavailable)
