package guard

import (
	"context"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/aside"
)

// ReadsWaiting is how many of g's reads wait for a round trip.
func ReadsWaiting(g *Guard) int { return aside.ReadsWaiting(g.e) }

// Flush waits for the flights and refreshes under way on g.
func Flush(ctx context.Context, g *Guard) error { return aside.Flush(ctx, g.e) }

// Field is the hash field of g's entries, once a Get or Set bound g.
func Field(g *Guard) string { return aside.Field(g.e) }

// MaxUnwritten is how many unwritten IDs a Guard keeps before it overflows.
const MaxUnwritten = aside.MaxUnwritten

// AgeWrites makes the writes g remembers look d older.
func AgeWrites(g *Guard, d time.Duration) { aside.AgeWrites(g.e, d) }

// SetAfterRead runs f between each Get's read and its answer until restore.
func SetAfterRead(f func(id string)) (restore func()) { return aside.SetAfterRead(f) }

// SetBeforeAutoRebuild runs f in each automatic rebuild between its checks
// and the rebuild lock, until restore.
func SetBeforeAutoRebuild(f func()) (restore func()) { return aside.SetBeforeAutoRebuild(f) }

// WatchEvery is how often the watcher of a Guard that wrote looks for a
// restart of Redis.
const WatchEvery = aside.WatchEvery

// SetWatch turns g's watcher off or back on: with it off, only a read
// notices the writes Redis lost.
func SetWatch(g *Guard, on bool) { aside.SetWatch(g.e, on) }

// AutoRebuilding reports whether an automatic rebuild of g is under way.
func AutoRebuilding(g *Guard) bool { return aside.AutoRebuilding(g.e) }

// Joins returns a channel that receives the value key of each caller that
// joins a flight under way on g, until restore: tests wait for callers to
// reach a flight instead of sleeping.
func Joins(g *Guard, n int) (joins <-chan string, restore func()) {
	ch := make(chan string, n)
	return ch, aside.SetJoined(g.e, func(key string) {
		select {
		case ch <- key:
		default: // more joins than the test waits for
		}
	})
}

// HoldSharedRead makes the first shared read on g (readShared) wait, before
// it reads, until n other callers have joined it, until restore: a test of
// callers that share one read does not depend on when each arrives.
func HoldSharedRead(g *Guard, n int) (restore func()) {
	joined := make(chan struct{}, n)
	var once sync.Once
	return aside.SetShared(g.e, func(first bool) {
		if !first {
			select {
			case joined <- struct{}{}:
			default:
			}
			return
		}
		once.Do(func() {
			give := time.After(10 * time.Second) // callers that never join: the test fails on its counts, not by hanging
			for range n {
				select {
				case <-joined:
				case <-give:
					return
				}
			}
		})
	})
}

// LocalCopy is what g's local cache holds for id: "none", "fresh" or
// "gone" (its entry expired in Redis).
func LocalCopy(g *Guard, id string) string { return aside.LocalCopy(g.e, id) }

// RefreshCopy fetches g's copy of its filter now.
func RefreshCopy(ctx context.Context, g *Guard) error { return aside.RefreshCopy(ctx, g.e) }

// HoldCopy stops g's own refreshes of its copy of the filter (after the one
// under way) until release.
func HoldCopy(g *Guard) (release func()) { return aside.HoldCopy(g.e) }
