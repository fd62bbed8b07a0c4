package faults_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

const (
	written = 200 // IDs w0..w199: updated and invalidated all through the scenario
	writers = 4
)

// acked is the last version of each w-ID whose Invalidate Redis
// acknowledged, and when.
type acked struct {
	mu  sync.Mutex
	ver map[string]int
	at  map[string]time.Time
}

// stale checks a read of id that started at start: an older version than
// the last acknowledged before it is stale.
func (a *acked) stale(id string, v int, start time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.at[id].Before(start) && v < a.ver[id]
}

// TestSentinelFailover: a master, a replica and three Sentinels; traffic
// reads known and unknown IDs while four writers update rows and
// Invalidate them, and a second Guard (another process) reads the updated
// rows. The master is SIGKILLed and the Sentinels promote the replica. The
// row: 0 wrong values and 0 false not-found among the reads of unchanging
// rows; the invalidations the old master acknowledged but the replica never
// received (asynchronous replication) are counted, from the replica's data
// as the master died, and so are the stale reads of updated rows in either
// process.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	set, err := redisserver.StartReplicated(ctx, "cg", 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Stop)
	client := func() *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: set.Name, SentinelAddrs: set.SentinelAddrs(),
			ContextTimeoutEnabled: true, DialerRetries: 1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	src := newSource()
	for i := range written {
		src.rows["w"+strconv.Itoa(i)] = 0
	}
	open := func() *guard.Guard {
		g, err := guard.New(ctx, client(), "product", guardOptions(src))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	g, other := open(), open()
	if _, err := g.Rebuild(ctx, src.ids(ctx), nil); err != nil {
		t.Fatal(err)
	}
	for i := range known / 2 {
		if _, err := guard.Get(ctx, g, "p"+strconv.Itoa(i), src.load); err != nil {
			t.Fatal(err)
		}
	}
	ack := &acked{ver: map[string]int{}, at: map[string]time.Time{}}
	var staleWriter, staleOther, unwritten atomic.Int64
	var killed atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() { // writer w updates the IDs i with i % writers == w
			for n := w; ; n += writers {
				select {
				case <-stop:
					return
				default:
				}
				id := "w" + strconv.Itoa(n%written)
				read(ctx, g, src, ack, id, &staleWriter) // caches the row, so the invalidation has an entry to drop
				if killed.Load() {
					continue // no writes while the replica is read (see below)
				}
				src.mu.Lock()
				src.rows[id]++
				v := src.rows[id]
				src.mu.Unlock()
				err := g.Invalidate(ctx, id)
				switch {
				case err == nil:
					ack.mu.Lock()
					ack.ver[id], ack.at[id] = v, time.Now()
					ack.mu.Unlock()
				case errors.Is(err, guard.ErrUnavailable):
					unwritten.Add(1) // the Guard replays it
				default:
					t.Error(err)
				}
			}
		})
	}
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			read(ctx, other, src, ack, "w"+strconv.Itoa(n%written), &staleOther)
		}
	})
	var lost int
	runCounting(t, "sentinel: master SIGKILLed, replica promoted", &env{g: g, src: src}, 0, func() func() {
		replica := redis.NewClient(&redis.Options{Addr: set.Replicas[0].Addr})
		defer replica.Close()
		killed.Store(true)
		if err := set.Master.Kill(); err != nil {
			t.Fatal(err)
		}
		lost = lostInvalidations(t, replica, ack)
		killed.Store(false)
		return func() {}
	}, &lost)
	close(stop)
	wg.Wait()
	st := g.Stats()
	t.Logf("invalidations acknowledged and lost in the promotion: %d; stale reads of updated rows: %d in the writing process, "+
		"%d in the other; writes that failed and were replayed: %d; acknowledged writes noticed lost (the marks): %d", lost,
		staleWriter.Load(), staleOther.Load(), unwritten.Load(), st.WritesLost)
	if st.WritesLost < uint64(lost) { // every invalidation the promoted replica lacks is noticed from its marks
		t.Fatalf("%d invalidations lost in the failover, %d noticed: %+v", lost, st.WritesLost, st)
	}
}

// read reads id and counts a stale answer.
func read(ctx context.Context, g *guard.Guard, src *source, ack *acked, id string, stale *atomic.Int64) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	if v, err := guard.Get(ctx, g, id, src.load); err == nil && ack.stale(id, v, start) {
		stale.Add(1)
	}
}

// lostInvalidations reads the replica as the master died: an entry of a
// w-ID that holds an older version than its last acknowledged Invalidate
// is an invalidation the replica never received.
func lostInvalidations(t *testing.T, replica *redis.Client, ack *acked) int {
	t.Helper()
	ctx := context.Background()
	ack.mu.Lock()
	defer ack.mu.Unlock()
	lost := 0
	for id, want := range ack.ver {
		entry, err := replica.HGetAll(ctx, "cg:product:{"+id+"}").Result()
		if err != nil {
			t.Fatalf("read the replica: %v", err)
		}
		for field, frame := range entry {
			if field == keyspace.Filled {
				continue
			}
			var v int
			if codec.Decode(codec.Msgpack, []byte(frame), &v) == nil && v < want {
				lost++
			}
		}
	}
	return lost
}

// BenchmarkInvalidateOnReplicated prices the alternative to replaying
// recent writes after a failover: an Invalidate followed by WAIT for the
// replica's acknowledgement (master, one replica, three Sentinels).
//
//	cd faults && go test -run '^$' -bench InvalidateOnReplicated
func BenchmarkInvalidateOnReplicated(b *testing.B) {
	ctx := context.Background()
	set, err := redisserver.StartReplicated(ctx, "cg", 1, 3)
	if err != nil {
		b.Fatal(err)
	}
	defer set.Stop()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: set.Name, SentinelAddrs: set.SentinelAddrs(),
		ContextTimeoutEnabled: true, DialerRetries: 1})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "product", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	b.Run("ack", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := g.Invalidate(ctx, "w"+strconv.Itoa(i%written)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("wait-1-replica", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := g.Invalidate(ctx, "w"+strconv.Itoa(i%written)); err != nil {
				b.Fatal(err)
			}
			if n, err := rdb.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
				b.Fatalf("WAIT: %d replicas, %v", n, err)
			}
		}
	})
}
