package bloom

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// copyChunk is the size of one GETRANGE of a shard while a copy is fetched:
// Redis copies it out in one event-loop turn, short enough not to stall it.
const copyChunk = 1 << 20

// snapshot is one generation's bits in process memory: every shard, one
// after the other, in Redis's bit order (word w holds bytes 8w to 8w+7,
// big-endian). Bits are only ever set, with atomic ORs, so readers need no
// lock. It carries its own layout: it is probed with that layout alone.
type snapshot struct {
	gen   int64
	cfg   Config
	added uint64 // the meta's count when last fetched (a refresh skips an unchanged filter)
	words []atomic.Uint64
}

// localCopy is a Filter's copy of its bits (see RefreshCopy).
type localCopy struct {
	refresh sync.Mutex               // one RefreshCopy at a time
	mu      sync.Mutex               // orders Adds' local ORs with the start of a fetch
	whole   atomic.Pointer[snapshot] // the copy TestCopy answers from
	filling *snapshot                // a new generation being fetched (under mu): Adds go there too
}

// RefreshCopy fetches the bits of the filter's current generation into
// process memory (GETRANGEs of 1 MiB) for TestCopy, in place when the copy
// holds that generation (bits are only set within one), else into a new copy
// that replaces the old once whole. A generation that is not ready returns
// ErrNotReady and leaves the copy as it was. It reports the copy's size.
func (f *Filter) RefreshCopy(ctx context.Context) (int, error) {
	c := &f.mem
	c.refresh.Lock()
	defer c.refresh.Unlock()
	h, err := f.rdb.HGetAll(ctx, f.names.Meta()).Result()
	if err != nil {
		return 0, fmt.Errorf("bloom: copy: %w", redisfail.Wrap(err))
	}
	m, err := parseMeta(f.names, h)
	if errors.Is(err, errNoMeta) {
		return 0, ErrNotReady
	}
	if err != nil {
		return 0, fmt.Errorf("bloom: copy: %w", err)
	}
	if err := f.ready(ctx, m.cur); err != nil {
		return 0, err
	}
	s := c.whole.Load()
	switch {
	case s != nil && s.gen == m.cur.gen && s.cfg == m.cur.cfg && s.added == m.added:
		return len(s.words) * 8, nil // nothing added since the last fetch
	case s == nil || s.gen != m.cur.gen || s.cfg != m.cur.cfg:
		s = &snapshot{gen: m.cur.gen, cfg: m.cur.cfg, words: make([]atomic.Uint64, m.cur.cfg.Bits/64)}
		c.mu.Lock()
		c.filling = s
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.filling = nil
			c.mu.Unlock()
		}()
	}
	if err := f.fetch(ctx, m.cur, s); err != nil {
		return 0, err
	}
	s.added = m.added
	c.whole.Store(s)
	return len(s.words) * 8, nil
}

// ready checks the first readiness bit of each of l's shards (GETBIT): a
// filter that is not ready costs one round trip, not a shard's bytes.
func (f *Filter) ready(ctx context.Context, l *layout) error {
	pipe := f.rdb.Pipeline()
	bits := make([]*redis.IntCmd, len(l.keys))
	for i, k := range l.keys {
		bits[i] = pipe.GetBit(ctx, k, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bloom: copy: %w", redisfail.Wrap(err))
	}
	for _, b := range bits {
		if b.Val() != 1 {
			return ErrNotReady
		}
	}
	return nil
}

// fetch ORs the bits of generation l's shards into s, chunk by chunk,
// each checked whole and ready before any of its bits is used.
func (f *Filter) fetch(ctx context.Context, l *layout, s *snapshot) error {
	shardBytes := l.cfg.ShardBits / 8
	for i, key := range l.keys {
		for off := uint64(0); off < shardBytes; off += copyChunk {
			n := min(copyChunk, shardBytes-off)
			b, err := f.rdb.GetRange(ctx, key, int64(off), int64(off+n-1)).Bytes()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("bloom: copy: %w", redisfail.Wrap(err))
			}
			if uint64(len(b)) != n {
				return ErrNotReady // the shard is missing or short
			}
			for at := 0; at < len(b); at += blockBytes {
				if b[at]&0x80 == 0 {
					return ErrNotReady
				}
			}
			base := (uint64(i)*shardBytes + off) / 8
			for w := range n / 8 {
				if v := binary.BigEndian.Uint64(b[8*w:]); v != 0 {
					s.words[base+w].Or(v)
				}
			}
		}
	}
	return nil
}

// TestCopy answers Test from the copy in process memory, with no Redis
// command (ok false: no copy yet). The copy holds its generation's bits when
// last fetched and this process's Adds since: an ID another process added
// later reads absent, so "absent" here does not mean "does not exist".
func (f *Filter) TestCopy(id string) (maybe, ok bool) {
	s := f.mem.whole.Load()
	if s == nil {
		return false, false
	}
	return s.test(id), true
}

// CopyInfo is the generation and size in bytes of the copy TestCopy
// answers from (0, 0: none).
func (f *Filter) CopyInfo() (gen int64, bytes int) {
	if s := f.mem.whole.Load(); s != nil {
		return s.gen, len(s.words) * 8
	}
	return 0, 0
}

func (s *snapshot) test(id string) bool {
	var buf [16]uint64
	shard, _, offs := locate(&s.cfg, id, buf[:0])
	base := uint64(shard) * s.cfg.ShardBits
	for _, o := range offs {
		bit := base + o
		if s.words[bit/64].Load()&(1<<(63-bit%64)) == 0 {
			return false
		}
	}
	return true
}

func (s *snapshot) add(ids []string) {
	var buf [16]uint64
	for _, id := range ids {
		shard, _, offs := locate(&s.cfg, id, buf[:0])
		base := uint64(shard) * s.cfg.ShardBits
		for _, o := range offs {
			bit := base + o
			s.words[bit/64].Or(1 << (63 - bit%64))
		}
	}
}

// addToCopy sets ids' bits in the copy and in one being fetched. Called
// after the Add's round trips: a fetch that starts later reads them from
// Redis, one that started earlier gets them here.
func (f *Filter) addToCopy(ids []string) {
	c := &f.mem
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.whole.Load(); s != nil {
		s.add(ids)
	}
	if c.filling != nil {
		c.filling.add(ids)
	}
}
