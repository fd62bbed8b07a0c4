package bloom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// meta is the filter's meta hash, parsed.
type meta struct {
	cur   *layout
	next  *layout // the generation a rebuild is building, if any
	added uint64  // IDs loaded by the last rebuild plus IDs added since (repeats count again)
	sent  int64   // monoNow before the read that found it was sent (metaSince's reads)
}

var errNoMeta = errors.New("bloom: meta missing")

func (c Config) fields(prefix string) []any {
	return []any{
		prefix + "items", strconv.FormatUint(c.ExpectedItems, 10),
		prefix + "fp_rate", strconv.FormatFloat(c.FalsePositiveRate, 'g', -1, 64),
		prefix + "bits", strconv.FormatUint(c.Bits, 10),
		prefix + "hashes", strconv.Itoa(c.Hashes),
		prefix + "shards", strconv.Itoa(c.Shards),
		prefix + "shard_bits", strconv.FormatUint(c.ShardBits, 10),
	}
}

func parseConfig(h map[string]string, prefix string) (Config, error) {
	var c Config
	var err error
	num := func(name string) uint64 {
		v, e := strconv.ParseUint(h[prefix+name], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("bloom: meta field %s%s = %q", prefix, name, h[prefix+name])
		}
		return v
	}
	c.ExpectedItems = num("items")
	c.Bits = num("bits")
	c.Hashes = int(num("hashes"))
	c.Shards = int(num("shards"))
	c.ShardBits = num("shard_bits")
	c.FalsePositiveRate, _ = strconv.ParseFloat(h[prefix+"fp_rate"], 64)
	if err == nil && (c.Shards < 1 || c.ShardBits < blockBits || c.ShardBits%blockBits != 0 || c.Hashes < 1 || c.Hashes > 16) {
		err = fmt.Errorf("bloom: meta layout %+v out of range", c)
	}
	return c, err
}

func parseMeta(names keyspace.Filter, h map[string]string) (*meta, error) {
	if h["format"] == "" { // missing, or partial: what is left counts for nothing
		return nil, errNoMeta
	}
	if h["format"] != metaFormat || h["hash"] != hashName {
		return nil, fmt.Errorf("%w: format %q hash %q, this client speaks %s/%s", ErrMismatch, h["format"], h["hash"], metaFormat, hashName)
	}
	gen, err := strconv.ParseInt(h["gen"], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bloom: meta gen %q", h["gen"])
	}
	cfg, err := parseConfig(h, "")
	if err != nil {
		return nil, err
	}
	loaded, _ := strconv.ParseUint(h["loaded"], 10, 64)
	added, _ := strconv.ParseUint(h["added"], 10, 64)
	m := &meta{added: added, cur: &layout{gen: gen, cfg: cfg, keys: shardKeys(names, gen, cfg.Shards), loaded: loaded}}
	if s := h["next"]; s != "" {
		ngen, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bloom: meta next %q", s)
		}
		ncfg, err := parseConfig(h, "next_")
		if err != nil {
			return nil, err
		}
		m.next = &layout{gen: ngen, cfg: ncfg, keys: shardKeys(names, ngen, ncfg.Shards)}
	}
	return m, nil
}

// openMeta reads the meta hash, creating it (and allocating the shards of
// its first generation) with cfg if it does not exist.
func (f *Filter) openMeta(ctx context.Context, cfg Config) (*meta, error) {
	// A new filter's generation is the clock in microseconds, not 1: after
	// Redis lost the filter, a client may still hold the layout of a
	// generation from before, and a new generation of that number (sized
	// otherwise) would have its probes read the new bits with the old
	// layout: existing IDs absent (TestGenerationsOutliveALostFilter).
	m, created, err := f.createMeta(ctx, time.Now().UnixMicro(), cfg, 0)
	if err != nil || !created {
		return m, err
	}
	// Shards of this generation left from before the meta was lost hold
	// bits of another life: start from empty ones.
	if err := allocate(ctx, f.rdb, m.cur); err != nil {
		return nil, fmt.Errorf("bloom: open %s: %w", f.base, redisfail.Wrap(err))
	}
	return m, nil
}

// createMeta stores a meta of generation gen with cfg unless a complete one
// exists (loaded: what its rebuild read), and returns the stored one.
func (f *Filter) createMeta(ctx context.Context, gen int64, cfg Config, loaded uint64) (*meta, bool, error) {
	fields := append([]any{"format", metaFormat, "hash", hashName, "gen", strconv.FormatInt(gen, 10),
		"added", strconv.FormatUint(loaded, 10), "loaded", strconv.FormatUint(loaded, 10)}, cfg.fields("")...)
	res, err := createMeta.Run(ctx, f.rdb, []string{f.names.Meta()}, fields...).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("bloom: open %s: %w", f.base, redisfail.Wrap(err))
	}
	if len(res) != 2 {
		return nil, false, fmt.Errorf("bloom: open %s: unexpected reply %v", f.base, res)
	}
	m, err := parseMeta(f.names, flatToMap(res[1]))
	if err != nil {
		return nil, false, fmt.Errorf("bloom: open %s: %w", f.base, err)
	}
	created, _ := res[0].(int64)
	return m, created == 1, nil
}

// readMeta reads the meta hash. If Redis lost it (evicted: it is read at
// open and rebuild only) while the shards of the generation this client
// knows are all there and ready, it is put back from this client's layout
// (no rebuild needed); otherwise it is recreated as openMeta does.
func (f *Filter) readMeta(ctx context.Context) (*meta, error) {
	h, err := f.rdb.HGetAll(ctx, f.names.Meta()).Result()
	if err != nil {
		return nil, redisfail.Wrap(err)
	}
	m, err := parseMeta(f.names, h)
	if !errors.Is(err, errNoMeta) {
		return m, err
	}
	if l := f.cur.Load(); l != nil {
		if b, err := f.bitsOf(ctx, l); err == nil && b.ready {
			if m, _, err := f.createMeta(ctx, l.gen, l.cfg, l.loaded); err == nil {
				return m, nil
			}
		}
	}
	cfg, err := configFor(f.opts.ExpectedItems, f.opts.FalsePositiveRate, f.opts.MaxShardBytes)
	if err != nil {
		return nil, err
	}
	return f.openMeta(ctx, cfg)
}

// allocate drops the keys in drop and replaces a generation's shards by
// empty ones at full size, every readiness bit clear, so that no later
// write grows a string while Redis blocks. One round trip.
func allocate(ctx context.Context, rdb redis.UniversalClient, l *layout, drop ...string) error {
	pipe := rdb.Pipeline()
	for _, k := range append(drop, l.keys...) {
		pipe.Unlink(ctx, k)
	}
	for _, k := range l.keys {
		pipe.Process(ctx, redis.NewIntSliceCmd(ctx, "BITFIELD", k, "SET", "u1", l.cfg.ShardBits-1, 0))
	}
	_, err := pipe.Exec(ctx)
	return err
}

func flatToMap(v any) map[string]string {
	out := map[string]string{}
	switch t := v.(type) {
	case []any:
		for i := 0; i+1 < len(t); i += 2 {
			out[fmt.Sprint(t[i])] = fmt.Sprint(t[i+1])
		}
	case map[any]any: // RESP3
		for k, v := range t {
			out[fmt.Sprint(k)] = fmt.Sprint(v)
		}
	}
	return out
}

// reload re-reads the meta now and adopts its current generation (see
// readMeta for a meta Redis lost).
func (f *Filter) reload(ctx context.Context) (*layout, error) {
	m, err := f.metaSince(ctx, monoNow())
	if err != nil {
		return nil, fmt.Errorf("bloom: reload: %w", err)
	}
	return m.cur, nil
}

// metaReads shares the re-reads of the meta among a Filter's callers: one
// at a time, and a caller that needs one waits for the read under way
// instead of answering ErrNotReady (metaSince). Times are monoNow's.
type metaReads struct {
	mu       sync.Mutex // guards the fields below
	run      *metaRead  // the read under way, if any
	last     *metaRead  // the last read that ended
	goneGen  int64      // a read after a probe found a shard of this generation gone still named it, ...
	goneNext *layout    // ... announcing this next one (nil: none, Redis lost the shard), ...
	goneSeen int64      // ... at this time: see follow
}

// metaRead is one HGETALL of the meta (readMeta), shared by its waiters.
type metaRead struct {
	start int64         // monoNow, before it was sent
	done  chan struct{} // closed when m and err are set
	m     *meta
	err   error
}

// monoNow is nanoseconds on the monotonic clock: a wall clock stepped back
// must not make an old read look fresh.
func monoNow() int64 { return int64(time.Since(monoBase)) }

var monoBase = time.Now()

// metaSince returns the meta as read by a read sent at or after since
// (monoNow): the last one's, the one under way's, or a new one's. It adopts
// the meta's current generation.
func (f *Filter) metaSince(ctx context.Context, since int64) (*meta, error) {
	rs := &f.reads
	for failed := false; ; {
		rs.mu.Lock()
		r := rs.run
		if r == nil {
			if l := rs.last; l != nil && l.start >= since && l.err == nil {
				rs.mu.Unlock()
				return l.m, nil
			}
			r = &metaRead{start: monoNow(), done: make(chan struct{})}
			rs.run = r
			rs.mu.Unlock()
			return f.runRead(ctx, r)
		}
		rs.mu.Unlock()
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, redisfail.Wrap(ctx.Err())
		}
		// Another caller's read can fail on that caller's ctx: the waiter
		// sends one of its own before it takes a failure.
		if r.start >= since && (r.err == nil || failed) {
			return r.m, r.err
		}
		failed = failed || r.err != nil
	}
}

// runRead makes the read r, which metaSince made the one under way, and
// hands it to its waiters, whatever happens; then it adopts what it read.
func (f *Filter) runRead(ctx context.Context, r *metaRead) (*meta, error) {
	rs := &f.reads
	before := f.cur.Load()
	func() {
		defer func() {
			rs.mu.Lock()
			rs.run, rs.last = nil, r
			rs.mu.Unlock()
			close(r.done)
		}()
		r.m, r.err = f.readMeta(ctx)
		if r.err == nil {
			r.m.sent = r.start
		}
	}()
	if r.err == nil {
		f.adopt(before, r.m.cur)
	}
	return r.m, r.err
}

// adopt makes l the generation probes use unless another one replaced old
// meanwhile (a later read, a Rebuild here), telling OnSwitch when it is
// another generation than old.
func (f *Filter) adopt(old, l *layout) {
	if f.cur.CompareAndSwap(old, l) && old != nil && old.gen != l.gen && f.opts.OnSwitch != nil {
		f.opts.OnSwitch(l.gen)
	}
}

// follow returns the generation to probe again after a probe of generation
// l answered not ready (gone: its block is missing), or nil when the filter
// itself is not ready. Another process's rebuild drops the old generation's
// shards just before it switches the meta to the new one, so a missing
// block is followed by a meta read sent after it was seen: the generation
// the meta names, or the one it announces while it switches. A block that
// is there but not ready (the generation is being built) re-reads the meta
// at most once per reloadEvery, as does a shard gone while the meta still
// names its generation (Redis evicted it), at most once per goneEvery: a
// rebuild that follows the loss switches soon, and a process that confirmed
// the loss then answers ErrNotReady for goneEvery at most.
func (f *Filter) follow(ctx context.Context, l *layout, gone bool) *layout {
	if cur := f.cur.Load(); cur.gen != l.gen {
		return cur // another caller moved on already
	}
	now := monoNow()
	since := now - int64(reloadEvery)
	rs := &f.reads
	if gone {
		rs.mu.Lock()
		recent, next := rs.goneGen == l.gen && now-rs.goneSeen < int64(goneEvery), rs.goneNext
		rs.mu.Unlock()
		switch {
		case recent && next != nil:
			return next // still switching, as read less than goneEvery ago
		case !recent:
			since = now
		}
	}
	m, err := f.metaSince(ctx, since)
	switch {
	case err != nil:
		return nil
	case m.cur.gen != l.gen:
		return m.cur
	case gone:
		// Switching (the next generation is whole once its blocks are
		// ready), or lost; either lasts until a switch, whose drop of
		// this generation a read at most goneEvery later sees.
		rs.mu.Lock()
		rs.goneGen, rs.goneNext, rs.goneSeen = l.gen, m.next, m.sent // when it was read, not now
		rs.mu.Unlock()
		return m.next
	}
	return nil
}
