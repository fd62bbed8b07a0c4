package guard

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Recent writes: Redis acknowledges a write before its replicas have it, so
// a failover can lose it, and a restart loses what the last dump missed.
// When a read finds the server gone (a refused dial, a closed connection,
// LOADING, READONLY: a failover that loses writes fails commands so for as
// long as the Sentinels take to notice; a slow server does not count), or
// the Guard notices a restart or failover, the IDs written in the last
// recentFor (at most maxRecent) are replayed as if their writes had failed
// (replay.go). WAIT after each write would cost a round trip to a replica
// per write and still not say which replica is promoted
// (docs/incidents.md).
const (
	recentFor = 10 * time.Second
	maxRecent = 1_000
)

// recentWrite is a write that reached Redis.
type recentWrite struct {
	id string
	at time.Time
}

// wrote remembers ids as written now, in a ring of the last maxRecent.
func (u *unwritten) wrote(ids []string) {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.recent == nil {
		u.recent = make([]recentWrite, maxRecent)
	}
	for _, id := range ids {
		u.recent[u.next%maxRecent] = recentWrite{id: id, at: now}
		u.next++
	}
}

// suspectRecent replays the writes of the last recentFor: Redis failed or
// failed over since they were acknowledged.
func (g *Guard) suspectRecent(why string) {
	u := &g.unw
	var ids []string
	u.mu.Lock()
	for _, w := range u.recent {
		if w.id != "" && time.Since(w.at) < recentFor {
			ids = append(ids, w.id)
		}
	}
	u.mu.Unlock()
	if len(ids) > 0 {
		g.keep(ids, "cacheguard: "+why+"; this process's writes of the last seconds are replayed", nil)
	}
}

// eachMaster runs fn on every master of a cluster or ring, or on rdb.
func eachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c redis.Cmdable) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	}
	return fn(ctx, rdb)
}

// restarts notices that Redis restarted or failed over: the run ids of
// its masters changed since the Guard last looked.
type restarts struct {
	mu       sync.Mutex  // guards runID
	runID    string      // the masters' run ids, sorted and joined ("": not read yet)
	checking atomic.Bool // a check after an outage runs (see recovered)
}

// recovered is told that reads succeed again after failing: the Guard
// looks, in the background, whether Redis restarted meanwhile.
func (g *Guard) recovered() {
	g.unw.wakeReplay()
	if !g.restarts.checking.CompareAndSwap(false, true) {
		return
	}
	g.retry(func() bool {
		ctx, cancel := context.WithTimeout(g.bg.ctx, g.opts.Tuning.RedisTimeout)
		defer cancel()
		g.checkRestart(ctx)
		return true
	}, func() { g.restarts.checking.Store(false) }, nil)
}

// checkRestart reads the masters' run ids and compares them with the last
// ones read. A change is logged once, and makes the filter be rebuilt from
// Filter.IDs (a dump or a promoted replica may lack recent Adds). An ACL
// without INFO leaves it unknown. It runs after connecting, after an
// outage ends and after a replay.
func (g *Guard) checkRestart(ctx context.Context) {
	var mu sync.Mutex
	var ids []string
	err := eachMaster(ctx, g.rdb, func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		}
		return nil
	})
	if err != nil || len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	now := strings.Join(ids, ",")
	r := &g.restarts
	r.mu.Lock()
	was := r.runID
	r.runID = now
	r.mu.Unlock()
	if was == "" || was == now {
		return
	}
	g.stats.restarts.Add(1)
	g.log.Warn("cacheguard: redis restarted or failed over (its run id changed); failed and recent writes are replayed, "+
		"the filter rebuilt", "filter_ids", g.opts.Filter.IDs != nil)
	g.bf.stale.Store(true)
	g.autoRebuild("redis restarted or failed over")
	g.suspectRecent("redis restarted or failed over")
}
