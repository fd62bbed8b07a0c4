package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/redisfail"
)

// GetMany: Get for many IDs, with Get's answers and guarantees for each.
// One round trip reads them all (on a cluster, each node its share in
// parallel); the misses load once per ID across processes, and those whose
// locks this call holds together in one call (batchload.go).

// BatchLoadFunc loads the values of ids from the source of truth, for
// GetMany. An ID missing from the map does not exist (it gets an empty
// marker); an error fails every ID of the call and nothing is cached.
type BatchLoadFunc[T any] func(ctx context.Context, ids []string) (map[string]T, error)

// GetMany returns the values of the ids that exist, in a map (an ID that
// does not exist is not in it), for list pages and joins. One round trip
// reads every ID's entry (with the bloom probes while reads miss; on a
// cluster, each node its share in parallel): a warm page costs that alone.
// The misses are loaded once per ID across processes, and those whose lock
// this call takes load together in one call of load; IDs it does not return
// get "not found" markers. With Options.Local, memory answers first.
// Malformed IDs fail the call with ErrInvalidKey; if some IDs fail, the map
// holds the others and the error joins the failures. When Redis cannot
// answer, the misses load through in one call.
func GetMany[T any](ctx context.Context, g *Guard, ids []string, load BatchLoadFunc[T]) (map[string]T, error) {
	if g == nil || load == nil {
		return nil, errNil("GetMany")
	}
	if g.tel == nil {
		return getMany(ctx, g, ids, load)
	}
	ctx, span := g.tel.start(ctx, "cacheguard.GetMany")
	out, err := getMany(ctx, g, ids, load)
	g.tel.endMany(span, len(ids), len(out), err)
	return out, err
}

// manyCall is one GetMany, built once by getMany: the Guard, the batch load
// function, the map its answers go into, and when the call started (see
// since). Its steps are methods, as a Get's are (call).
type manyCall[T any] struct {
	g    *Guard
	load BatchLoadFunc[T]
	out  map[string]T
	from since
}

// getMany is GetMany without its span.
func getMany[T any](ctx context.Context, g *Guard, ids []string, load BatchLoadFunc[T]) (map[string]T, error) {
	pass, err := g.sup.enter()
	if err != nil {
		return nil, err
	}
	defer g.sup.leave(pass)
	if err := bind[T](g); err != nil {
		return nil, err
	}
	ids = dedupe(ids)
	keys, err := g.valueKeys(ids)
	if err != nil {
		return nil, err
	}
	c := &manyCall[T]{g: g, load: load, out: make(map[string]T, len(ids))}
	out := c.out
	if err := c.unwritten(ctx, &ids, &keys, nil); err != nil { // before the local copies too: see get
		return out, err
	}
	c.from = since{at: g.starts.Load()} // a flight that answers a miss must have started after this (join)
	if g.local != nil {
		c.from.epoch = g.local.epoch.Load() // before the local lookups and the read: see local.put
		ids, keys = localMany(ctx, g, ids, keys, out)
	}
	if len(ids) == 0 {
		return out, nil
	}
	replays := g.unw.replayed.Load() // a replay landing during the read: see get
	reads, err := g.readMany(ctx, ids, keys)
	if downOrRefusing(err) { // as Get: the copy answers what it has never seen, the rest loads through
		through, uerr := g.absentManyInCopy(ctx, ids, err)
		if len(through) == 0 {
			return out, uerr
		}
		return out, errors.Join(uerr, c.loadThrough(ctx, through, err))
	}
	if err != nil {
		return nil, err
	}
	if g.unw.replayed.Load() != replays { // a replay landed during the read: any entry read may be one it deleted
		return out, c.loadThrough(ctx, ids, fmt.Errorf("cacheguard: %s: %w", g.name, errUnwritten))
	}
	if err := c.unwritten(ctx, &ids, &keys, &reads); err != nil { // the read's check may have found some lost
		return out, err
	}
	var missIDs, missKeys []string
	var unconfirmed []error
	for i, r := range reads {
		switch r.verdict {
		case verdictRejected:
			g.answeredMany(ctx, outRejected, false, false)
			continue
		case verdictUnconfirmed:
			g.answeredMany(ctx, outFailed, false, false)
			unconfirmed = append(unconfirmed, g.unconfirmed(ctx, ids[i], nil))
			continue
		case verdictEntry:
			if e := decodeEntry[T](ctx, g, keys[i], r.raw); e.ok {
				g.answeredMany(ctx, e.found.outcome, false, false)
				if e.err == nil {
					out[ids[i]] = e.v
					if g.local != nil {
						g.local.put(ids[i], r.raw, kept(g, e.v), r.life, c.from.epoch)
					}
				}
				continue
			}
		}
		missIDs, missKeys = append(missIDs, ids[i]), append(missKeys, keys[i])
	}
	if len(missIDs) == 0 {
		return out, errors.Join(unconfirmed...)
	}
	return out, errors.Join(append(unconfirmed, c.fill(ctx, missIDs, missKeys))...)
}

// unwritten loads through (as in an outage) the IDs whose writes have
// not reached Redis, or were lost by it, and takes them out of ids, keys
// and reads (nil: not read yet).
func (c *manyCall[T]) unwritten(ctx context.Context, ids, keys *[]string, reads *[]readResult) error {
	g := c.g
	if g.unw.n.Load() == 0 {
		return nil
	}
	var restIDs, restKeys, through []string
	var rest []readResult
	for i, id := range *ids {
		switch {
		case g.unw.has(id):
			through = append(through, id)
		default:
			restIDs, restKeys = append(restIDs, id), append(restKeys, (*keys)[i])
			if reads != nil {
				rest = append(rest, (*reads)[i])
			}
		}
	}
	*ids, *keys = restIDs, restKeys
	if reads != nil {
		*reads = rest
	}
	if len(through) == 0 {
		return nil
	}
	return c.loadThrough(ctx, through, fmt.Errorf("cacheguard: %s: %w", g.name, errUnwritten))
}

// localMany answers the IDs that the in-process cache holds (into out) and
// returns the others, with their keys.
func localMany[T any](ctx context.Context, g *Guard, ids, keys []string, out map[string]T) (restIDs, restKeys []string) {
	for i, id := range ids {
		if v, st := fromLocal[T](g, id); st == localFresh {
			out[id] = v
			g.answeredMany(ctx, outLocalHit, false, false)
			continue
		}
		restIDs, restKeys = append(restIDs, id), append(restKeys, keys[i])
	}
	return restIDs, restKeys
}

// readMany is GetMany's read: each ID's entry, and its bloom probe in the
// same pipeline while recent reads missed (the adaptive order of read: a
// warm page is one command per ID; otherwise the probes of the IDs that
// had no entry follow in a second round trip).
func (g *Guard) readMany(ctx context.Context, ids, keys []string) ([]readResult, error) {
	done, err := g.outage.before()
	if err != nil {
		return nil, fmt.Errorf("cacheguard: %s: read: %w", g.name, err)
	}
	out, err := g.readManyOnce(ctx, ids, keys)
	g.outage.after(done, err)
	return out, err
}

func (g *Guard) readManyOnce(ctx context.Context, ids, keys []string) ([]readResult, error) {
	f := g.bf.f.Load()
	local := g.local != nil
	probeNow := f != nil && g.rd.probing(local)
	pipe := g.rdb.Pipeline()
	var sent time.Time // with Local: before the round trip, the PTTLs count from later (see local.put)
	if local {
		sent = time.Now()
	}
	chk := g.queueCheck(ctx, pipe) // a connection dialed since the last check: did Redis lose writes? (lost.go)
	probes := make([]bloom.Probe, len(ids))
	gets := make([]*redis.StringCmd, len(ids))
	var pttls []*redis.DurationCmd // with Local: a copy must not outlive its entry
	if local {
		pttls = make([]*redis.DurationCmd, len(ids))
	}
	for i, id := range ids {
		if probeNow {
			probes[i] = f.Queue(ctx, pipe, id)
		}
		gets[i] = pipe.HGet(ctx, keys[i], g.field())
		if pttls != nil {
			pttls[i] = pipe.PTTL(ctx, keys[i])
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	g.endCheck(ctx, chk)
	out := make([]readResult, len(ids))
	var missed []int
	for i := range ids {
		raw, err := gets[i].Bytes()
		switch {
		case err == nil:
			out[i] = readResult{verdict: verdictEntry, raw: raw}
			if pttls != nil {
				out[i].life = lifetime{ttl: max(pttls[i].Val(), 0), sent: sent}
			}
		case errors.Is(err, redis.Nil):
			missed = append(missed, i)
		default:
			return nil, g.fail(ctx, "read", "", redisfail.Wrap(err))
		}
	}
	g.rd.settle(local, probeNow, int64(len(ids)-len(missed)), int64(len(missed)))
	if len(missed) == 0 {
		return out, nil
	}
	if f != nil && !probeNow { // the probes of the IDs with no entry, now
		pipe := g.rdb.Pipeline()
		for _, i := range missed {
			probes[i] = f.Queue(ctx, pipe, ids[i])
		}
		_, _ = pipe.Exec(ctx)
	}
	for _, i := range missed {
		maybe, err := true, error(bloom.ErrNotReady)
		if f != nil {
			maybe, err = probes[i].Result(ctx)
		}
		var verr error
		if out[i], verr = g.verdict(ctx, ids[i], maybe, err); verr != nil {
			return nil, verr
		}
	}
	return out, nil
}

// fill runs the call's misses as flights of the Guard's one flight group
// (join), one goroutine per ID, their loads gathered into one call of
// load (batchLoad): a Get or GetMany of the same ID in this process joins
// the flight, and the flight keeps what it loaded in the local cache. It
// adds what the flights found to out.
func (mc *manyCall[T]) fill(ctx context.Context, ids, keys []string) error {
	g := mc.g
	b := newBatch(g, mc.load, len(ids))
	type answer struct {
		id  string
		j   joined[T]
		err error
	}
	answers := make(chan answer, len(ids))
	for i := range ids {
		// The supervisor's; ends with the flight it runs or joins, which
		// its ctx cannot cut short (the flight bound, RedisTimeout, does).
		g.sup.spawn(func() {
			m := &member[T]{b: b}
			defer m.decide() // answered, loaded, failed or panicked: no longer undecided
			c := &call[T]{g: g, id: ids[i], vkey: keys[i], load: m.load, from: mc.from}
			fm := &miss[T]{flight: c.flight(), member: m}
			jctx := context.WithoutCancel(ctx)
			j, err := c.join(jctx, offer[T]{fl: &fm.flight, run: fm.run, giveBack: func() { fm.giveBack(jctx) }}, nil)
			answers <- answer{id: ids[i], j: j, err: err}
		})
	}
	var errs []error
	for range len(ids) {
		var a answer
		select {
		case a = <-answers:
		case <-ctx.Done():
			return ctx.Err() // the flights go on, bounded, and answer into the buffer
		}
		g.answeredMany(ctx, a.j.fl.outcome, a.j.shared && !a.j.mine, false)
		if a.err == nil {
			var v T
			if v, a.err = joinedValue(g, a.id, a.j); a.err == nil {
				mc.out[a.id] = v
			}
		}
		if a.err != nil && !errors.Is(a.err, ErrNotFound) {
			errs = append(errs, panicked(g, a.id, a.err))
		}
	}
	return errors.Join(errs...)
}

// loadThrough answers the call's ids without Redis (the outage policy):
// one call of load for every ID, uncached, within the load-through cap.
func (c *manyCall[T]) loadThrough(ctx context.Context, ids []string, cause error) error {
	g := c.g
	if g.outage.failFast {
		return cause
	}
	if err := g.outage.admit(g, ""); err != nil {
		return err
	}
	defer g.outage.slots.Release(1)
	g.stats.loadThroughs.Add(uint64(len(ids)))
	lctx, cancel := context.WithTimeout(ctx, g.opts.LoadTimeout)
	defer cancel()
	lctx, done := g.tel.load(lctx)
	m, err := c.load(lctx, ids)
	done(err)
	g.loaded(len(ids), err)
	o := outLoaded
	if err != nil {
		o = outFailed
	}
	for range ids {
		g.answeredMany(ctx, o, false, true)
	}
	if err != nil {
		return fmt.Errorf("cacheguard: %s: load: %w", g.name, err)
	}
	for _, id := range ids {
		if v, ok := m[id]; ok {
			c.out[id] = v
		}
	}
	return nil
}
