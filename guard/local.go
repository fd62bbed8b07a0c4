package guard

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// LocalOptions turns on an in-process cache in front of Redis: values this
// process read or loaded are served from memory, with no round trip, for up
// to TTL. Invalidate reaches every process's copy through a pub/sub channel
// of the Guard's, so TTL only bounds what a lost message can leave stale.
type LocalOptions struct {
	// Size caps the values kept; when full, an arbitrary entry makes room.
	// Default 10,000.
	Size int
	// TTL is how long a value is served from memory. Default 1 second.
	TTL time.Duration
}

// local is the in-process cache: 16 shards of frames by value key.
type local struct {
	seed     maphash.Seed
	shards   [16]localShard
	perShard int
	ttl      time.Duration
	// epoch rises with every invalidation this process hears of; a frame
	// read from Redis before an invalidation must not be kept after it.
	epoch atomic.Uint64

	ps   *redis.PubSub // invalidation messages
	done chan struct{} // closed when listen returns
}

type localShard struct {
	mu sync.Mutex // guards m
	m  map[string]localEntry
}

type localEntry struct {
	frame   []byte
	expires int64 // unix nanos
}

// newLocal subscribes to the invalidation channel and starts the goroutine
// that applies its messages; close stops both.
func newLocal(ctx context.Context, rdb redis.UniversalClient, channel string, o LocalOptions) (*local, error) {
	if o.Size == 0 {
		o.Size = 10_000
	}
	if o.TTL == 0 {
		o.TTL = time.Second
	}
	if o.Size < 0 || o.TTL < 0 {
		return nil, fmt.Errorf("%w: Local %+v", ErrInvalidOptions, o)
	}
	l := &local{seed: maphash.MakeSeed(), perShard: max(1, (o.Size+15)/16), ttl: o.TTL, done: make(chan struct{})}
	for i := range l.shards {
		l.shards[i].m = map[string]localEntry{}
	}
	l.ps = rdb.Subscribe(ctx, channel)
	if _, err := l.ps.Receive(ctx); err != nil {
		_ = l.ps.Close()
		return nil, fmt.Errorf("cacheguard: subscribe %s: %w", channel, err)
	}
	go l.listen(l.ps.Channel()) // owned by the Guard; ends when close closes ps
	return l, nil
}

func (l *local) listen(msgs <-chan *redis.Message) {
	defer close(l.done)
	for m := range msgs {
		l.epoch.Add(1)
		l.drop(m.Payload)
	}
}

func (l *local) close() error {
	err := l.ps.Close()
	<-l.done
	return err
}

func (l *local) shard(key string) *localShard {
	return &l.shards[maphash.String(l.seed, key)%uint64(len(l.shards))]
}

func (l *local) get(key string) ([]byte, bool) {
	s := l.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	s.mu.Unlock()
	if !ok || time.Now().UnixNano() > e.expires {
		return nil, false
	}
	return e.frame, true
}

// put keeps frame unless an invalidation arrived since epoch was read.
func (l *local) put(key string, frame []byte, epoch uint64) {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.epoch.Load() != epoch {
		return
	}
	if _, ok := s.m[key]; !ok && len(s.m) >= l.perShard {
		for k := range s.m { // make room: an arbitrary entry goes
			delete(s.m, k)
			break
		}
	}
	s.m[key] = localEntry{frame: frame, expires: time.Now().Add(l.ttl).UnixNano()}
}

func (l *local) drop(key string) {
	s := l.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

func (l *local) len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
