package bloom

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/bits"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bitset"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
	"github.com/cacheguard/cacheguard/lock"
)

var (
	//go:embed lua/begin_rebuild.lua
	beginRebuildLua string
	//go:embed lua/switch_gen.lua
	switchGenLua string
	//go:embed lua/merge_shard.lua
	mergeShardLua string
	//go:embed lua/abort_rebuild.lua
	abortRebuildLua string

	beginRebuild = redis.NewScript(beginRebuildLua)
	switchGen    = redis.NewScript(switchGenLua)
	mergeShard   = redis.NewScript(mergeShardLua)
	abortRebuild = redis.NewScript(abortRebuildLua)
)

// RebuildOptions tunes Rebuild. A nil *RebuildOptions means defaults.
type RebuildOptions struct {
	// ExpectedItems and FalsePositiveRate resize the filter; 0 keeps the
	// current generation's sizing. Clients follow the new layout by
	// themselves, and processes started later with the old sizing adopt it
	// (unless Options.Strict); update their options at leisure.
	ExpectedItems     uint64
	FalsePositiveRate float64
	// ChunkBytes is the size of one SETRANGE upload. Default 1 MiB.
	ChunkBytes int
	// Progress, if set, is called as IDs are hashed (each time the count
	// passes a multiple of 100,000) and as bytes are uploaded (every chunk),
	// one call at a time. The hashing workers make the first calls, while
	// ids is ranged; a panic in one panics out of Rebuild.
	Progress func(RebuildProgress)
	// Force switches even to a generation built from fewer than half the
	// IDs the filter holds (see ErrShortSource): after a mass delete.
	Force bool
}

// RebuildProgress reports how far a Rebuild is.
type RebuildProgress struct {
	IDs           int    // IDs hashed so far (all the source's, once the upload began)
	BytesUploaded uint64 // bitmap bytes sent to Redis so far
	BytesTotal    uint64 // bitmap bytes to send in all
}

// Rebuild replaces the filter with a new generation built from every ID of
// the source of truth (ids), makes it ready, and returns the number of IDs
// read. It fails with ErrRebuilding while another process rebuilds the
// filter; an error from ids, a source short of the IDs the filter holds
// (ErrShortSource) or a key of the new generation lost meanwhile leaves the
// current generation in place. ids is ranged only once the new generation
// is announced (Add writes to both from then on), so it must see every ID
// committed before it is ranged: a query run inside the iterator does.
func (f *Filter) Rebuild(ctx context.Context, ids iter.Seq2[string, error], opts *RebuildOptions) (int, error) {
	var o RebuildOptions
	if opts != nil {
		o = *opts
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = 1 << 20
	}
	// One rebuild at a time per filter, across processes.
	const leaseTTL = 30 * time.Second
	l, err := lock.New(f.rdb).Obtain(ctx, f.names.RebuildLock(), leaseTTL, nil)
	if errors.Is(err, lock.ErrNotObtained) {
		return 0, ErrRebuilding
	}
	if err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", err)
	}
	stop := l.KeepAlive(ctx, leaseTTL, nil)
	defer func() {
		stop()
		_ = l.Release(context.WithoutCancel(ctx))
	}()

	cur, err := f.reload(ctx)
	if err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", err)
	}
	n, p := cmp.Or(o.ExpectedItems, cur.cfg.ExpectedItems), cur.cfg.FalsePositiveRate
	if o.FalsePositiveRate > 0 {
		p = o.FalsePositiveRate
	}
	cfg, err := configFor(n, p, f.opts.MaxShardBytes)
	if err != nil {
		return 0, err
	}
	next := &layout{gen: cur.gen + 1, cfg: cfg, keys: shardKeys(f.names, cur.gen+1, cfg.Shards)}
	r := &rebuild{f: f, o: o, cur: cur, next: next}
	count, err := r.run(ctx, ids)
	if err != nil {
		r.abort(context.WithoutCancel(ctx))
		return count, err
	}
	f.cur.Store(next) // this client's own switch: its caller knows
	return count, nil
}

// rebuildBatch is how many IDs the source's goroutine hands a worker at once.
const rebuildBatch = 1024

// rebuild is one Rebuild of a filter, from the announce to the switch.
type rebuild struct {
	f         *Filter
	o         RebuildOptions
	cur, next *layout
	announced bool

	hashed   atomic.Int64 // IDs the workers hashed
	mu       sync.Mutex   // one call of Progress at a time; guards reported and panicked
	reported int          // the most IDs a call of Progress gave
	panicked any          // what a call of Progress in a worker panicked with, raised again by run
}

// progress calls Progress, unless a worker's count is behind one given.
func (r *rebuild) progress(p RebuildProgress) {
	if r.o.Progress == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.IDs >= r.reported {
		r.reported = p.IDs
		r.o.Progress(p)
	}
}

// countHashed counts n more IDs hashed by a worker, and reports progress
// each time the count passes a multiple of 100,000. A panic in Progress is
// kept for run to raise: the worker goes on, so that the source's goroutine
// is not left waiting for its batches.
func (r *rebuild) countHashed(n int) {
	if c := int(r.hashed.Add(int64(n))); c/100_000 != (c-n)/100_000 {
		defer func() {
			if p := recover(); p != nil {
				r.mu.Lock()
				if r.panicked == nil {
					r.panicked = p
				}
				r.mu.Unlock()
			}
		}()
		r.progress(RebuildProgress{IDs: c})
	}
}

func (r *rebuild) run(ctx context.Context, ids iter.Seq2[string, error]) (int, error) {
	f, cur, next, cfg := r.f, r.cur, r.next, r.next.cfg
	// Fresh, empty shards, and no staging key left by a rebuild that died.
	if err := allocate(ctx, f.rdb, next, stagingKeys(next.keys)...); err != nil {
		return 0, fmt.Errorf("bloom: rebuild: %w", redisfail.Wrap(err))
	}
	// Announce: from here on Add writes to both generations.
	args := append([]any{strconv.FormatInt(cur.gen, 10), strconv.FormatInt(next.gen, 10)}, cfg.fields("next_")...)
	if ok, err := beginRebuild.Run(ctx, f.rdb, []string{f.names.Meta()}, args...).Int(); err != nil {
		return 0, fmt.Errorf("bloom: rebuild: announce generation %d: %w", next.gen, redisfail.Wrap(err))
	} else if ok != 1 {
		return 0, fmt.Errorf("bloom: rebuild: announce generation %d: generation %d is no longer current", next.gen, cur.gen)
	}
	r.announced = true

	sets, count, err := r.build(ctx, ids)
	if r.panicked != nil { // the workers have ended: no lock needed
		panic(r.panicked)
	}
	if err != nil {
		return count, err
	}
	if err := r.checkCount(ctx, count); err != nil {
		return count, err
	}
	if err := r.upload(ctx, sets, count); err != nil {
		return count, err
	}
	// Switch. Drop the old generation first: its readers find no block,
	// fail open and re-read the meta, instead of missing IDs that Add now
	// writes only to the new generation (and Add skips a missing shard).
	if err := unlink(ctx, f.rdb, cur.keys); err != nil {
		return count, fmt.Errorf("bloom: rebuild: drop generation %d: %w", cur.gen, redisfail.Wrap(err))
	}
	if ok, err := switchGen.Run(ctx, f.rdb, []string{f.names.Meta()}, strconv.FormatInt(next.gen, 10), count).Int(); err != nil {
		return count, fmt.Errorf("bloom: rebuild: switch to generation %d: %w", next.gen, redisfail.Wrap(err))
	} else if ok != 1 {
		return count, fmt.Errorf("bloom: rebuild: switch to generation %d: it is no longer the announced one", next.gen)
	}
	return count, nil
}

// build sets the bits of every ID locally, in one bitset per shard with
// every readiness bit set: the caller's goroutine ranges ids and hands
// batches to one worker per core (atomic ORs: a bit only goes from 0 to 1).
// It waits for the workers before it returns, on every path.
func (r *rebuild) build(ctx context.Context, ids iter.Seq2[string, error]) ([]*bitset.BitSet, int, error) {
	cfg := r.next.cfg
	sets := make([]*bitset.BitSet, cfg.Shards)
	words := make([][]uint64, cfg.Shards)
	for i := range sets {
		sets[i] = bitset.New(uint(cfg.ShardBits))
		for b := uint64(0); b < cfg.ShardBits; b += blockBits {
			sets[i].Set(uint(b))
		}
		words[i] = sets[i].Words()
	}
	// 2 batches per worker and one being filled bound the IDs held.
	workers := runtime.GOMAXPROCS(0)
	full, free := make(chan []string, workers), make(chan []string, 2*workers+1)
	for range cap(free) {
		free <- make([]string, 0, rebuildBatch)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(full) // first: the workers' loops end
	for range workers {
		wg.Go(func() {
			for b := range full {
				setLocal(&cfg, words, b)
				r.countHashed(len(b))
				free <- b[:0]
			}
		})
	}
	count, err := r.read(ctx, ids, full, free)
	if err != nil {
		return nil, count, err
	}
	return sets, count, nil
}

// read ranges ids into batches taken from free and sent to full.
func (r *rebuild) read(ctx context.Context, ids iter.Seq2[string, error], full, free chan []string) (int, error) {
	count := 0
	b := <-free
	for id, err := range ids {
		if err != nil {
			return count, fmt.Errorf("bloom: rebuild: source: %w", err)
		}
		b = append(b, id)
		count++
		if len(b) == cap(b) {
			full <- b
			if err := ctx.Err(); err != nil {
				return count, err
			}
			b = <-free
		}
	}
	full <- b
	return count, nil
}

// setLocal ORs the bits of ids into their shards' words. It hashes a group
// of IDs before touching memory, so that the group's cache misses overlap.
func setLocal(cfg *Config, words [][]uint64, ids []string) {
	var group [64]struct {
		shard int
		word  uint64 // the block's first word in its shard
		mask  [blockWords]uint64
	}
	var buf [16]uint64
	for len(ids) > 0 {
		n := min(len(ids), len(group))
		for i, id := range ids[:n] {
			g := &group[i]
			shard, at, offs := locate(cfg, id, buf[:0])
			g.shard, g.word, g.mask = shard, at/8, [blockWords]uint64{}
			for _, o := range offs {
				g.mask[o/64-g.word] |= 1 << (o % 64)
			}
		}
		for _, g := range group[:n] {
			w := words[g.shard][g.word : g.word+blockWords]
			for j, m := range g.mask {
				if m != 0 {
					atomic.OrUint64(&w[j], m)
				}
			}
		}
		ids = ids[n:]
	}
}

// checkCount refuses a generation that would answer "absent" for IDs the
// filter holds today (a source cut short or empty: a failed query piped
// into the CLI), and one that would answer "maybe" far more often than
// asked (no protection: it says how to size it).
func (r *rebuild) checkCount(ctx context.Context, count int) error {
	cfg := r.next.cfg
	if est := estimatedFPRate(cfg, count); est > 2*cfg.FalsePositiveRate {
		return fmt.Errorf("%w: %d IDs in a filter sized for %d give an estimated false-positive rate of %.3g "+
			"(target %g); rebuild with ExpectedItems of at least %d", ErrTooSmall, count, cfg.ExpectedItems, est,
			cfg.FalsePositiveRate, count)
	}
	if r.o.Force {
		return nil
	}
	held, err := r.f.held(ctx, r.cur)
	if err != nil {
		return fmt.Errorf("bloom: rebuild: %w", err)
	}
	if float64(count) < held/2 {
		return fmt.Errorf("%w: the source gave %d IDs and the filter holds about %.0f; "+
			"the current generation stays (rebuild with Force after a mass delete)", ErrShortSource, count, held)
	}
	return nil
}

// upload sends each shard's bits into a staging key and ORs them into the
// new shard, which may already hold bits that Add wrote during the build.
// The merge refuses a shard or a copy that Redis lost meanwhile
// (merge_shard.lua), and the switch waits until every shard is still there.
func (r *rebuild) upload(ctx context.Context, sets []*bitset.BitSet, count int) error {
	f, next, cfg := r.f, r.next, r.next.cfg
	shardBytes := cfg.ShardBits / 8
	p0 := RebuildProgress{IDs: count, BytesTotal: shardBytes * uint64(cfg.Shards)}
	chunk := make([]byte, r.o.ChunkBytes)
	for i, set := range sets {
		staging := keyspace.Staging(next.keys[i])
		words := set.Words()
		for off := uint64(0); off < shardBytes; off += uint64(len(chunk)) {
			c := chunk[:min(uint64(len(chunk)), shardBytes-off)]
			redisOrder(c, words, off)
			if err := f.rdb.SetRange(ctx, staging, int64(off), string(c)).Err(); err != nil {
				return fmt.Errorf("bloom: rebuild: upload: %w", redisfail.Wrap(err))
			}
			p0.BytesUploaded += uint64(len(c))
			r.progress(p0)
		}
		switch ok, err := mergeShard.Run(ctx, f.rdb, []string{next.keys[i], staging}, set.Count()).Int(); {
		case err != nil:
			return fmt.Errorf("bloom: rebuild: merge: %w", redisfail.Wrap(err))
		case ok != 1:
			return r.lost()
		}
		sets[i] = nil // let the memory go
	}
	pipe := f.rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(next.keys))
	for i, k := range next.keys {
		exists[i] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bloom: rebuild: %w", redisfail.Wrap(err))
	}
	for _, e := range exists {
		if e.Val() != 1 {
			return r.lost()
		}
	}
	return nil
}

func (r *rebuild) lost() error {
	return fmt.Errorf("bloom: rebuild: a key of generation %d was lost while it was built (evicted?): "+
		"Adds made meanwhile may lack from it, so generation %d stays", r.next.gen, r.cur.gen)
}

// abort forgets the announced generation and drops its keys, so that Add
// stops writing there.
func (r *rebuild) abort(ctx context.Context) {
	if !r.announced {
		return
	}
	// Only once the meta no longer names it: a switch whose reply was lost
	// may have made it current.
	if ok, err := abortRebuild.Run(ctx, r.f.rdb, []string{r.f.names.Meta()}, strconv.FormatInt(r.next.gen, 10)).Int(); err == nil && ok == 1 {
		_ = unlink(ctx, r.f.rdb, append(r.next.keys, stagingKeys(r.next.keys)...))
	}
}

// redisOrder fills c with the bytes of a bitset starting at byte off, in
// Redis's bit order: bit i is byte i/8, most significant bit first, where
// bitset keeps bit i in word i/64, least significant bit first.
func redisOrder(c []byte, words []uint64, off uint64) {
	for j := range c {
		b := off + uint64(j)
		if w := b / 8; w < uint64(len(words)) {
			c[j] = bits.Reverse8(byte(words[w] >> (8 * (b % 8))))
		} else {
			c[j] = 0
		}
	}
}

func stagingKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = keyspace.Staging(k)
	}
	return out
}

// unlink deletes keys without blocking Redis on large values, one command
// per key (they live in different slots).
func unlink(ctx context.Context, rdb redis.UniversalClient, keys []string) error {
	pipe := rdb.Pipeline()
	for _, k := range keys {
		pipe.Unlink(ctx, k)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// estimatedFPRate is the false-positive rate of a filter of cfg holding n
// IDs: (1 − e^(−k·n/m))^k.
func estimatedFPRate[N int | uint64](cfg Config, n N) float64 {
	k, m := float64(cfg.Hashes), float64(cfg.Bits)
	return math.Pow(1-math.Exp(-k*float64(n)/m), k)
}
