package guard_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestPositionOnEveryMaster: a change feed's position (the follower's) is
// held by every master of a Redis Cluster (one key, standalone), so that a
// rollback of any master shows: each copy in turn goes back to an older
// position (that master restarted from an older dump) or is lost (flushed),
// and SetPosition refuses to write over it (each copy is set only if it
// holds what this Guard last saw there), Position answers the lower value,
// and the feed, having repaired from there, sets its position again. Control: one key for the whole
// Cluster lives on one master, and this test finds it short of the masters.
func TestPositionOnEveryMaster(t *testing.T) {
	clusterToo(t)
	ctx := context.Background()
	c, g, _ := setup(t, 10, nil)
	e := g.Feed()
	if pos, err := e.SetPosition(ctx, "f", 0, 100); err != nil || pos != 100 {
		t.Fatalf("first SetPosition: %d, %v", pos, err)
	}
	keys, err := c.AllKeys(ctx, c.Prefix+":product:pos:f*")
	if err != nil {
		t.Fatal(err)
	}
	var masters atomic.Int32 // ForEachMaster runs fn on each master at once
	if err := c.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != int(masters.Load()) {
		t.Fatalf("the position is in %d keys (%v), want one on each of the %d masters", len(keys), keys, masters.Load())
	}
	slices.Sort(keys)
	cur := uint64(100) // the position the feed last saw
	for _, k := range keys {
		for _, lost := range []string{"older dump", "flushed"} {
			t.Run(fmt.Sprintf("%s %s", k, lost), func(t *testing.T) {
				want := uint64(50)
				if lost == "older dump" {
					err = c.Set(ctx, k, "50", 0).Err()
				} else {
					want, err = 0, c.Del(ctx, k).Err()
				}
				if err != nil {
					t.Fatal(err)
				}
				next := cur + 100
				if pos, err := e.SetPosition(ctx, "f", cur, next); err != nil || pos != want {
					t.Fatalf("SetPosition over a master's %s: %d, %v; want it refused with %d", lost, pos, err, want)
				}
				if pos, err := e.Position(ctx, "f"); err != nil || pos != want {
					t.Fatalf("Position after a master's %s: %d, %v; want %d", lost, pos, err, want)
				}
				// The feed repairs from want, then sets its position again
				// (the other masters' copies may hold it already).
				if pos, err := e.SetPosition(ctx, "f", want, next); err != nil || pos != next {
					t.Fatalf("SetPosition after the repair: %d, %v; want %d", pos, err, next)
				}
				if pos, err := e.Position(ctx, "f"); err != nil || pos != next {
					t.Fatalf("Position after the repair: %d, %v; want %d", pos, err, next)
				}
				cur = next
			})
		}
	}
}
