package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/feed"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// What a change feed that writes through a Guard (the PostgreSQL follower,
// in a module of its own) reaches beyond the API, through internal/feed: its
// position here, and the inspector's read (inspect.go).
//
// Positions: the feed keeps, beside the Guard's keys, the position up to
// which its writes landed. It is set after those writes were acknowledged,
// so a Redis that still holds a position holds every write before it (a
// dump, an AOF and a replica keep a prefix of the commands): a position
// Redis shows lower than the feed confirmed means Redis lost writes.

// followed is a Guard as a change feed sees it (feed.Engine): the same
// struct, with the methods only the feed calls.
type followed Guard

func init() { feed.Of = func(g any) feed.Engine { return (*followed)(g.(*Guard)) } }

var (
	//go:embed lua/set_position.lua
	setPositionLua string
	setPosition    = redis.NewScript(setPositionLua)
)

// Position returns the position stored for feed (0: none).
func (g *followed) Position(ctx context.Context, feed string) (uint64, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	s, err := g.rdb.Get(ctx, g.keys.Position(feed)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return parsePosition(feed, s, err)
}

// SetPosition sets feed's position to pos if Redis still holds from (0:
// none), and returns what Redis holds now: pos, or the value it found
// instead (a lower one says Redis lost writes).
func (g *followed) SetPosition(ctx context.Context, feed string, from, pos uint64) (uint64, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return 0, err
	}
	defer g.sup.leave(pass)
	want := ""
	if from > 0 {
		want = strconv.FormatUint(from, 10)
	}
	s, err := setPosition.Run(ctx, g.rdb, []string{g.keys.Position(feed)}, want, strconv.FormatUint(pos, 10)).Text()
	switch {
	case err == nil && s == "":
		return pos, nil
	case err == nil && s == " ":
		return 0, nil
	}
	return parsePosition(feed, s, err)
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
