package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Lost writes: Redis acknowledges a write before its replicas and its next
// dump have it, so a restart or a failover can lose it. Every write also
// advances a counter of the Guard's own in Redis (its mark, one per cluster
// slot), and the Guard keeps the writes that landed with the value each got
// (for recentFor, at most maxRecent). After a connection is dialed, the next
// read (or the watcher, health.go) compares the marks with the highest each
// got: one behind says the writes past it were lost, and they are replayed
// (replay.go); one that left the ring past the gap drops every entry.
const (
	recentFor = time.Hour
	maxRecent = 100_000
	markTTL   = 2 * recentFor // a mark outlives the writes it counts; a dead process's goes
)

// marked is a write that landed: its ID, the slot of its key and the value
// its mark got.
type marked struct {
	id   string
	slot uint16
	n    int64
	at   time.Time
}

// marks is what the Guard knows of its writes in Redis (Guard.marks).
type marks struct {
	token   string // this Guard's marks are its own: no other process advances them
	cluster bool   // a mark per slot (ClusterClient), else one
	// dials counts the connections dialed on the client (dialCounter) and the
	// written slots that moved to another master (touch); checked, the dials
	// the last check covered: while they differ, a read (or the watcher) checks.
	dials   *atomic.Uint64
	checked atomic.Uint64
	wrote   atomic.Bool // a write landed: until then there is nothing to check
	check   sync.Mutex  // one check at a time
	// refusedOnce: an ACL refusing the marks is logged once.
	refusedOnce sync.Once

	mu      sync.Mutex          // guards the fields below
	ring    []marked            // the recent writes, oldest at head once full
	head    int                 // index of the oldest in a full ring
	given   map[markOf]struct{} // the marks of the writes in ring: a mark given twice says Redis went back
	high    map[uint16]int64    // per slot, the highest mark a write got
	dropped map[uint16]int64    // per slot, the highest mark of a write that left ring
}

// markOf is a slot's mark value.
type markOf struct {
	slot uint16
	n    int64
}

func newMarks(ctx context.Context, rdb redis.UniversalClient) *marks {
	var b [8]byte
	_, _ = rand.Read(b[:])
	_, cluster := rdb.(*redis.ClusterClient)
	return &marks{token: hex.EncodeToString(b[:]), cluster: cluster, dials: countDials(ctx, rdb),
		given: map[markOf]struct{}{}, high: map[uint16]int64{}, dropped: map[uint16]int64{}}
}

// dialCounter is a hook that counts the connections a client dials. It
// holds no Guard, so a Guard closed on a shared client is not kept alive by
// it (go-redis cannot remove a hook).
type dialCounter struct{ n *atomic.Uint64 }

func (d dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			d.n.Add(1)
		}
		return c, err
	}
}
func (dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// countDials hooks rdb (and, in a cluster or ring, every node it has or
// will have) with a dialCounter.
func countDials(ctx context.Context, rdb redis.UniversalClient) *atomic.Uint64 {
	n := new(atomic.Uint64)
	n.Store(1) // a first check before the first read: the client may have dialed before New
	h := dialCounter{n}
	type nodes interface {
		OnNewNode(func(*redis.Client))
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}
	if c, ok := rdb.(nodes); ok {
		c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
		_ = c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error { n.AddHook(h); return nil })
		return n
	}
	rdb.AddHook(h)
	return n
}

// queuedMarks are the mark increments of one write, queued in its pipeline
// after its commands (a dump or replica that has the increment has the
// write before it).
type queuedMarks struct {
	ids   []string
	slots []uint16
	incr  []*redis.IntCmd
}

// queueMarks queues the increments of the marks of keys (the value keys of
// ids) into pipe.
func (g *Guard) queueMarks(ctx context.Context, pipe redis.Pipeliner, ids, keys []string) *queuedMarks {
	m := g.marks
	q := &queuedMarks{ids: ids, slots: make([]uint16, len(keys)), incr: make([]*redis.IntCmd, len(keys))}
	seen := map[uint16]bool{}
	for i, k := range keys {
		var s uint16 // the slot of k's mark
		if m.cluster {
			s = keyspace.Slot(k)
		}
		q.slots[i] = s
		q.incr[i] = pipe.Incr(ctx, g.keys.Mark(m.token, s, m.cluster))
		if !seen[s] {
			seen[s] = true
			pipe.PExpire(ctx, g.keys.Mark(m.token, s, m.cluster), markTTL)
		}
	}
	return q
}

// landed records the writes whose marks advanced. A mark given twice says
// Redis went back to before the first: the writes it counted since are
// lost. (Replies of one mark may come back out of order; never twice.)
func (g *Guard) landed(ctx context.Context, q *queuedMarks) {
	m := g.marks
	now := time.Now()
	var lost []string
	overflow, wrote := false, false
	m.mu.Lock()
	for i, c := range q.incr {
		n, err := c.Result()
		if g.refusal(err) != "" {
			m.refusedOnce.Do(func() { g.refused(ctx, "noticing writes Redis lost", err) })
		}
		if err != nil {
			continue
		}
		s := q.slots[i]
		if _, twice := m.given[markOf{s, n}]; twice || n <= m.dropped[s] {
			l, o := m.lostLocked(s, n-1, m.high[s])
			lost, overflow = append(lost, l...), overflow || o
		}
		m.high[s] = max(m.high[s], n)
		m.pushLocked(marked{id: q.ids[i], slot: s, n: n, at: now})
		wrote = true
	}
	m.mu.Unlock()
	if wrote && !m.wrote.Swap(true) { // the first write that landed: from now on a restart may lose one
		g.sup.goLoop(g.watch)
	}
	if len(lost) > 0 || overflow {
		g.writesLost(lost, overflow)
	}
}

// pushLocked adds w to the ring; the oldest leaves it when the ring is full
// or older than recentFor. Callers hold m.mu.
func (m *marks) pushLocked(w marked) {
	for len(m.ring) > 0 && len(m.ring) < maxRecent && w.at.Sub(m.ring[0].at) > recentFor {
		m.leaveLocked(m.ring[0])
		m.ring = m.ring[1:]
	}
	m.given[markOf{w.slot, w.n}] = struct{}{}
	if len(m.ring) < maxRecent {
		m.ring = append(m.ring, w)
		return
	}
	m.leaveLocked(m.ring[m.head])
	m.ring[m.head] = w
	m.head = (m.head + 1) % maxRecent
}

func (m *marks) leaveLocked(w marked) {
	delete(m.given, markOf{w.slot, w.n})
	m.dropped[w.slot] = max(m.dropped[w.slot], w.n)
}

// lostLocked is what Redis lost when slot's mark went back to at, from as
// high as hi: the IDs whose writes got a mark in (at, hi], taken out of the
// ring, and whether such a write had left it already. The slot's high mark
// becomes the highest left. Callers hold m.mu.
func (m *marks) lostLocked(slot uint16, at, hi int64) (ids []string, overflow bool) {
	high := at
	for i := range m.ring {
		w := &m.ring[i]
		switch {
		case w.slot != slot || w.id == "":
		case w.n > at && w.n <= hi:
			delete(m.given, markOf{w.slot, w.n})
			ids, w.id = append(ids, w.id), ""
		default:
			high = max(high, w.n)
		}
	}
	overflow = m.dropped[slot] > at
	if overflow {
		m.dropped[slot] = at // dropped once: its entries go with the overflow's
	}
	m.high[slot] = high
	return ids, overflow
}

// writesLost replays the writes Redis lost (all the Guard's entries, with
// overflow), and rebuilds the filter from Filter.IDs: the bits of lost Adds
// are gone too. ids has an ID once per lost write: one replay covers an ID
// written more than once.
func (g *Guard) writesLost(ids []string, overflow bool) {
	g.stats.writesLost.Add(uint64(len(ids)) + uint64(b2i(overflow)))
	h := g.holdUnwritten(ids, overflow)
	filter := ", and the filter rebuilt from Filter.IDs"
	if g.opts.Filter.IDs == nil {
		filter = "; the filter is not rebuilt (no Filter.IDs)"
	}
	g.log.Warn("cacheguard: redis lost acknowledged writes (a restart from an older dump, or a failover to a lagging "+
		"replica): their IDs are replayed"+filter, "writes", len(ids), "ids", h.added,
		"repeats", len(ids)-h.added-h.already-h.past, "already_held", h.already, "past_capacity", h.past,
		"all_entries", overflow, "filter_ids", g.opts.Filter.IDs != nil)
	if h.start {
		g.startReplay()
	}
	g.bf.stale.Store(true)
	g.autoRebuild("redis lost writes")
}

// refused says, at ERROR, that the ACL refuses a command the Guard needs
// for what, naming the command to add to the Guard's user (from a script:
// the command on the line Redis names).
func (g *Guard) refused(ctx context.Context, what string, err error) {
	g.log.ErrorContext(ctx, "cacheguard: redis refuses a command the Guard needs (ACL): "+what+" cannot work "+
		"until the Guard's user may run it (docs/usage.md, Redis users)", "command", g.refusal(err), "err", redisfail.Wrap(err))
}

// refusal is the command an ACL refused in err, "" if err is no refusal
// (redisfail.Refused, with the Guard's scripts).
func (g *Guard) refusal(err error) string {
	return redisfail.Refused(err, autoRebuildLua, delIfEqualLua, inspectLua, setPositionLua, replaceLua)
}

// eachMaster runs fn on every master of a cluster or ring, or on rdb. A
// cluster is anything with ForEachMaster (a *redis.ClusterClient, or a
// type that wraps one and says so), so that a wrapper is not taken for a
// single server whose SCAN would see one master's keys.
func eachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c redis.Cmdable) error) error {
	type masters interface {
		ForEachMaster(ctx context.Context, fn func(ctx context.Context, n *redis.Client) error) error
	}
	switch c := rdb.(type) {
	case masters:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	}
	return fn(ctx, rdb)
}
