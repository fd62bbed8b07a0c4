package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/feed"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// What a change feed that writes through a Guard (the PostgreSQL follower,
// in a module of its own) reaches beyond the API, through Feed's
// internal/feed.Engine: its position here, and the inspector's read
// (inspect.go).
//
// Positions: the feed keeps, beside the Guard's keys, the position up to
// which its writes landed. It is set after those writes were acknowledged,
// so a Redis that still holds a position holds every write before it (a
// dump, an AOF and a replica keep a prefix of the commands): a position
// Redis shows lower than the feed confirmed means Redis lost writes. On a
// Redis Cluster each master loses writes on its own, so each holds a copy
// (PositionIn, the first slot of each master's first range, from CLUSTER
// SLOTS), and the position is the lowest copy: a rollback of any master
// shows. A reshard that leaves a master without a copy shows as no
// position (the feed then drops and rebuilds: safe, not cheap).

// followed is a Guard as a change feed sees it (feed.Engine): the same
// struct, with the methods only the feed calls.
type followed Guard

// Feed is for change feeds (the PostgreSQL follower): it returns the Guard
// as one sees it, and promises nothing else. The Engines of one Guard are
// equal (the same pointer), so they can key a map.
func (g *Guard) Feed() feed.Engine { return (*followed)(g) }

var (
	//go:embed lua/set_position.lua
	setPositionLua string
	setPosition    = redis.NewScript(setPositionLua)
)

// Position returns the position stored for feed (0: none), the lowest of
// its copies on a Cluster.
func (g *followed) Position(ctx context.Context, feed string) (uint64, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	keys, err := g.positionKeys(ctx, feed)
	if err != nil {
		return 0, err
	}
	gets := make([]*redis.StringCmd, len(keys))
	if len(keys) == 1 {
		gets[0] = g.rdb.Get(ctx, keys[0])
	} else {
		pipe := g.rdb.Pipeline()
		for i, k := range keys {
			gets[i] = pipe.Get(ctx, k)
		}
		_, _ = pipe.Exec(ctx)
	}
	low := uint64(math.MaxUint64)
	for i, get := range gets {
		s, err := get.Result()
		if errors.Is(err, redis.Nil) {
			s, err = "", nil
		}
		if err != nil {
			return 0, redisfail.Wrap(err)
		}
		g.posSlots.saw(keys[i], s)
		pos := uint64(0)
		if s != "" {
			if pos, err = parsePosition(feed, s, nil); err != nil {
				return 0, err
			}
		}
		low = min(low, pos)
	}
	return low, nil
}

// SetPosition sets feed's position to pos if Redis still holds from (0:
// none), and returns what Redis holds now: pos, or the value it found
// instead (a lower one says Redis lost writes). On a Cluster each copy is
// set if it still holds what this Guard last read or set there (from, for
// a copy it has not seen), and the lowest value found is returned.
func (g *followed) SetPosition(ctx context.Context, feed string, from, pos uint64) (uint64, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	keys, err := g.positionKeys(ctx, feed)
	if err != nil {
		return 0, err
	}
	want := ""
	if from > 0 {
		want = strconv.FormatUint(from, 10)
	}
	to := strconv.FormatUint(pos, 10)
	sets := make([]*redis.Cmd, len(keys))
	if len(keys) == 1 {
		sets[0] = setPosition.Run(ctx, g.rdb, keys, want, to)
	} else {
		expect := make([]string, len(keys))
		for i, k := range keys {
			expect[i] = g.posSlots.last(k, want)
		}
		pipe := g.rdb.Pipeline()
		for i, k := range keys {
			sets[i] = setPosition.EvalSha(ctx, pipe, []string{k}, expect[i], to)
		}
		if _, err := pipe.Exec(ctx); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			for i, k := range keys { // the script is loaded by the first Eval
				sets[i] = setPosition.Run(ctx, g.rdb, []string{k}, expect[i], to)
			}
		}
	}
	low, refused := uint64(math.MaxUint64), false
	for i, set := range sets {
		s, err := set.Text()
		if err != nil {
			return 0, redisfail.Wrap(err)
		}
		switch s {
		case "":
			g.posSlots.saw(keys[i], to)
			continue
		case " ":
			s = ""
		}
		g.posSlots.saw(keys[i], s)
		found := uint64(0)
		if s != "" {
			if found, err = parsePosition(feed, s, nil); err != nil {
				return 0, err
			}
		}
		low, refused = min(low, found), true
	}
	if !refused {
		return pos, nil
	}
	return low, nil
}

// positionKeys are the keys of feed's position: one, or on a Redis Cluster
// one per master.
func (g *followed) positionKeys(ctx context.Context, feed string) ([]string, error) {
	// A cluster is anything with ForEachMaster, as for eachMaster.
	if _, ok := g.rdb.(interface {
		ForEachMaster(context.Context, func(context.Context, *redis.Client) error) error
	}); !ok {
		return []string{g.keys.Position(feed)}, nil
	}
	slots, err := g.masterSlots(ctx)
	if err != nil {
		return nil, err
	}
	if slots == nil { // a wrapper of one server
		return []string{g.keys.Position(feed)}, nil
	}
	keys := make([]string, len(slots))
	for i, s := range slots {
		keys[i] = g.keys.PositionIn(feed, s)
	}
	return keys, nil
}

// slotMap is a Guard's copy of masterSlots, and what it last read or set
// of each copy of a position on a Cluster.
type slotMap struct {
	mu    sync.Mutex // guards the fields below
	slots []uint16
	at    time.Time
	seen  map[string]string // position key → its value as last read or set ("": absent)
}

// saw records that key held v ("": absent).
func (m *slotMap) saw(key, v string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]string{}
	}
	m.seen[key] = v
}

// last is what key held when last read or set, or def if never.
func (m *slotMap) last(key, def string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.seen[key]; ok {
		return v
	}
	return def
}

// slotsEvery is how long a Guard keeps the cluster's slot map for
// positionKeys: a feed sets its position at every batch.
const slotsEvery = time.Second

// masterSlots is the first slot of each master's first range (CLUSTER
// SLOTS, read again when slotsEvery old); nil on a server that is no
// cluster.
func (g *followed) masterSlots(ctx context.Context) ([]uint16, error) {
	c := &g.posSlots
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.slots != nil && time.Since(c.at) < slotsEvery {
		return c.slots, nil
	}
	ranges, err := g.rdb.ClusterSlots(ctx).Result()
	if redis.HasErrorPrefix(err, "This instance has cluster support disabled") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cacheguard: the cluster's slots: %w", redisfail.Wrap(err))
	}
	slices.SortFunc(ranges, func(a, b redis.ClusterSlot) int { return a.Start - b.Start })
	seen := map[string]bool{}
	var slots []uint16
	for _, r := range ranges {
		if len(r.Nodes) > 0 && !seen[r.Nodes[0].Addr] {
			seen[r.Nodes[0].Addr] = true
			slots = append(slots, uint16(r.Start))
		}
	}
	if len(slots) == 0 {
		return nil, fmt.Errorf("cacheguard: the cluster serves no slot: %w", redisfail.ErrUnavailable)
	}
	c.slots, c.at = slots, time.Now()
	return slots, nil
}

func parsePosition(feed, s string, err error) (uint64, error) {
	if err != nil {
		return 0, redisfail.Wrap(err)
	}
	pos, err := strconv.ParseUint(s, 10, 64)
	if err != nil || pos == 0 {
		return 0, fmt.Errorf("cacheguard: the position of %s in redis, %q, is not a position", feed, s)
	}
	return pos, nil
}
