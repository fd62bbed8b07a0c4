package bloom

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// Add puts id into the filter. See AddMany.
func (f *Filter) Add(ctx context.Context, id string) error { return f.AddMany(ctx, []string{id}) }

// AddMany puts ids into the filter, after the source of truth committed
// them: one round trip, or two when the meta names another generation or a
// rebuild in progress. It does not make a filter ready (see Rebuild), and
// sets the bits in this client's copy (RefreshCopy) too.
func (f *Filter) AddMany(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	pipe := f.rdb.Pipeline()
	p := f.QueueAdd(ctx, pipe, ids)
	_, _ = pipe.Exec(ctx) // errors are read per command by Result
	return p.Result(ctx)
}

// PendingAdd is an AddMany queued in a caller's pipeline.
type PendingAdd struct {
	f     *Filter
	ids   []string
	l     *layout
	meta  *redis.MapStringStringCmd
	added *redis.Cmd // the meta's new count, or -1 if the meta is gone
	sets  []*redis.Cmd
}

// QueueAdd queues the first round trip of AddMany(ids) into pipe, so that a
// caller can send it with its own commands; call Result after the pipeline
// ran.
func (f *Filter) QueueAdd(ctx context.Context, pipe redis.Pipeliner, ids []string) *PendingAdd {
	p := &PendingAdd{f: f, ids: ids, l: f.cur.Load()}
	if len(ids) == 0 {
		return p
	}
	p.meta = pipe.HGetAll(ctx, f.names.Meta())
	p.added = countAdded.Eval(ctx, pipe, []string{f.names.Meta()}, len(ids))
	p.sets = queueSetBits(ctx, pipe, p.l, ids)
	return p
}

// Result finishes the add: it checks the queued commands and, if the meta
// names another generation or a rebuild in progress, sets the bits there too
// (one more round trip). Redis failures wrap ErrUnavailable.
func (p *PendingAdd) Result(ctx context.Context) error {
	if len(p.ids) == 0 {
		return nil
	}
	defer p.f.addToCopy(p.ids) // after the round trips, whether they failed or not: see addToCopy
	if err := p.err(); err != nil {
		return fmt.Errorf("bloom: add: %w", redisfail.Wrap(err))
	}
	f, l := p.f, p.l
	m, err := parseMeta(f.names, p.meta.Val())
	added, _ := p.added.Int64()
	if err != nil || added < 0 {
		// The meta is gone (evicted?) while the bits above were set in
		// every shard that exists: put it back if the shards are whole
		// (readMeta), at most ten times a second.
		_, _ = f.metaSince(ctx, monoNow()-int64(reloadEvery))
		return nil
	}
	f.checkSaturation(ctx, m.cur, uint64(added))
	var more []*layout
	if m.cur.gen != l.gen {
		more = append(more, m.cur)
		f.adopt(l, m.cur)
	}
	if m.next != nil && m.next.gen != l.gen {
		more = append(more, m.next)
	}
	if len(more) == 0 {
		return nil
	}
	pipe := f.rdb.Pipeline()
	for _, nl := range more {
		queueSetBits(ctx, pipe, nl, p.ids)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bloom: add: %w", redisfail.Wrap(err))
	}
	return nil
}

// err is the first error of the queued commands, if any.
func (p *PendingAdd) err() error {
	err := cmp.Or(p.meta.Err(), p.added.Err())
	for _, c := range p.sets {
		err = cmp.Or(err, c.Err())
	}
	return err
}

// checkSaturation calls OnSaturated once per generation when the bits say
// the false-positive rate passed the target by SaturationMargin. The count of
// Adds only says when to look: at most once a minute, one BITCOUNT of a
// shard's first MiB, whose blocks are a uniform sample of the filter's.
func (f *Filter) checkSaturation(ctx context.Context, l *layout, added uint64) {
	if f.opts.OnSaturated == nil || f.saturated.Load() == l.gen {
		return
	}
	limit := l.cfg.FalsePositiveRate * (1 + f.opts.SaturationMargin)
	if estimatedFPRate(l.cfg, added) <= limit {
		return
	}
	now, last := time.Now().UnixNano(), f.lastSatCheck.Load()
	if now-last < int64(time.Minute) || !f.lastSatCheck.CompareAndSwap(last, now) {
		return
	}
	n := min(l.cfg.ShardBits/8, 1<<20) // bytes sampled: a whole number of blocks
	set, err := f.rdb.BitCount(ctx, l.keys[0], &redis.BitCount{Start: 0, End: int64(n) - 1}).Result()
	if err != nil {
		return
	}
	blocks := int64(n / blockBytes)
	fill := float64(max(set-blocks, 0)) / float64(blocks*usableBits) // readiness bits excluded
	est := math.Pow(fill, float64(l.cfg.Hashes))
	if est > limit && f.saturated.Swap(l.gen) != l.gen {
		f.opts.OnSaturated(Saturation{Generation: l.gen, Added: added, EstimatedFPRate: est, TargetFPRate: l.cfg.FalsePositiveRate})
	}
}

func queueSetBits(ctx context.Context, pipe redis.Pipeliner, l *layout, ids []string) []*redis.Cmd {
	var cmds []*redis.Cmd
	for shard, offs := range offsetsByShard(&l.cfg, ids) {
		args := make([]any, len(offs))
		for i, o := range offs {
			args[i] = o
		}
		cmds = append(cmds, setBits.Eval(ctx, pipe, []string{l.keys[shard]}, args...))
	}
	return cmds
}
