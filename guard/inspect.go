package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/internal/feed"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

var (
	//go:embed lua/inspect.lua
	inspectLua string
	inspect    = redis.NewScript(inspectLua)
)

// Inspect reads what Redis holds of ids as a Get elsewhere would find it, for
// the follower's inspector (internal/feed, position.go): one round trip, one
// script and one filter probe per ID, nothing written or loaded.
func (v *followed) Inspect(ctx context.Context, ids []string) ([]feed.Held, error) {
	g := (*Guard)(v)
	pass, err := g.sup.enter()
	if err != nil {
		return nil, err
	}
	defer g.sup.leave(pass)
	f, err := g.filter(ctx)
	if err != nil {
		return nil, err
	}
	held := make([]feed.Held, len(ids))
	cmds := make([]*redis.Cmd, len(ids))
	probes := make([]bloom.Probe, len(ids))
	for sha := true; ; sha = false { // the script by its SHA, sent whole if Redis lacks it
		pipe := g.rdb.Pipeline()
		for i, id := range ids {
			vkey, err := g.keys.Value(id)
			if err != nil {
				continue // never cached: not read (Now stays zero)
			}
			args := []any{keyspace.Filled, codec.Empty()}
			if sha {
				cmds[i] = inspect.EvalSha(ctx, pipe, []string{vkey}, args...)
			} else {
				cmds[i] = inspect.Eval(ctx, pipe, []string{vkey}, args...)
			}
			probes[i] = f.Queue(ctx, pipe, id)
		}
		if pipe.Len() == 0 {
			return held, nil
		}
		_, _ = pipe.Exec(ctx) // errors are read per command
		if !sha || !slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return c != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") }) {
			break
		}
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if err := c.Err(); err != nil {
			return nil, redisfail.Wrap(err)
		}
		h, err := parseHeld(c.Val())
		if err != nil {
			return nil, fmt.Errorf("cacheguard: %s %q: inspect: %w", g.name, ids[i], err)
		}
		maybe, err := probes[i].Result(ctx)
		if err != nil && !errors.Is(err, bloom.ErrNotReady) {
			return nil, err
		}
		h.Admitted = maybe || err != nil // not ready: Gets load through
		held[i] = h
	}
	return held, nil
}

// parseHeld reads inspect.lua's reply.
func parseHeld(v any) (feed.Held, error) {
	r, ok := v.([]any)
	if !ok || len(r) != 5 {
		return feed.Held{}, fmt.Errorf("unexpected reply %v", v)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(r[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(r[1]), 10, 64)
	values, ok1 := r[3].(int64)
	markers, ok2 := r[4].(int64)
	if err1 != nil || err2 != nil || !ok1 || !ok2 {
		return feed.Held{}, fmt.Errorf("unexpected reply %v", v)
	}
	h := feed.Held{Now: time.Unix(sec, usec*1000), Values: int(values), Markers: int(markers)}
	if s, ok := r[2].(string); ok {
		if us, err := strconv.ParseInt(s, 10, 64); err == nil {
			h.Filled = time.UnixMicro(us)
		}
	}
	return h, nil
}
