package guard

import (
	"context"
	_ "embed"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/backoff"
)

// Connecting: what a Guard keeps in Redis (its bloom filter, the miss's
// scripts, the invalidation subscription) is opened once, at New or, if
// Redis was down then, by a retry in the background; until then Gets fail
// open or load through. While the filter is not ready it is rebuilt from
// Filter.IDs (if set), one rebuild at a time, backing off across processes.

// filterState is the Guard's bloom filter and what it knows of its health
// (Guard.bf).
type filterState struct {
	f           atomic.Pointer[bloom.Filter] // nil until opened (New while Redis was down); see filter
	opts        *bloom.Options
	bypassing   atomic.Bool   // the filter answered ErrNotReady last time (logged once per episode)
	rebuilding  atomic.Bool   // an automatic rebuild is under way (autoRebuild)
	stale       atomic.Bool   // Redis restarted: the filter may lack recent Adds; rebuild it though it is ready
	mu          sync.Mutex    // held by each rebuild of this Guard's, automatic or not: one at a time; guards the two below
	lastAuto    time.Time     // when this Guard last started an automatic rebuild
	autoWait    time.Duration // the back-off after it (see mayAutoRebuild)
	copyWake    chan struct{} // cuts the wait of the filter's copy short (keepCopy); made by New, buffer 1
	copyHold    sync.Mutex    // held by each refresh of the copy; guards copyAt
	copyAt      time.Time     // when a refresh last landed; guarded by copyHold
	refusedOnce sync.Once     // the ACL refused the automatic rebuild a command: said once
	// evictionChecked: the eviction policy was read (or refused) once.
	evictionChecked atomic.Bool
}

// connect opens what a Guard keeps in Redis: its bloom filter, the
// scripts of a miss's write (so that the first one needs no second round
// trip) and, with
// Options.Local, the invalidation subscription that makes the local cache
// safe to use. Each step is done once; connect can be called again after a
// failure. Errors wrap ErrUnavailable or come from the filter (ErrMismatch).
func (g *Guard) connect(ctx context.Context) error {
	if g.bf.f.Load() == nil {
		f, err := bloom.Open(ctx, g.rdb, g.keys.Filter().Base(), g.bf.opts)
		if err != nil {
			return err
		}
		// A Guard given no sizing takes the stored one silently.
		if sized := g.opts.Filter.ExpectedItems != 0 || g.opts.Filter.FalsePositiveRate != 0; f.Adopted() && sized {
			cfg := f.Config()
			g.log.WarnContext(ctx, "cacheguard: the bloom filter in Redis is sized otherwise than Options say; using its layout",
				"stored_items", cfg.ExpectedItems, "stored_fp_rate", cfg.FalsePositiveRate,
				"options_items", g.opts.Filter.ExpectedItems, "options_fp_rate", g.opts.Filter.FalsePositiveRate)
		}
		g.bf.f.CompareAndSwap(nil, f)
	}
	if err := g.coord.LoadScripts(ctx); err != nil && !reply(err) {
		return err // a refusal (an ACL without script|load) only costs a NOSCRIPT round trip later
	}
	g.checkEviction(ctx)
	if g.local != nil {
		return g.local.arm(ctx, g.rdb, g.keys.Invalidated())
	}
	return nil
}

// checkEviction warns, once per Guard, when a master evicts with an
// allkeys-* policy: it may evict the filter, which has no TTL, where
// volatile-* evicts the values and markers alone (they all have one).
// An ACL that refuses INFO (the least-privilege user's) is said once at Info.
func (g *Guard) checkEviction(ctx context.Context) {
	if !g.bf.evictionChecked.CompareAndSwap(false, true) {
		return
	}
	var mu sync.Mutex
	var policies []string
	err := eachMaster(ctx, g.rdb, func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if p, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
				mu.Lock()
				policies = append(policies, p)
				mu.Unlock()
			}
		}
		return nil
	})
	switch {
	case reply(err):
		g.log.InfoContext(ctx, "cacheguard: cannot read redis's eviction policy (INFO refused); if it is allkeys-*, "+
			"it may evict the bloom filter (docs/usage.md, Redis users)", "err", err)
	case err != nil:
		g.bf.evictionChecked.Store(false) // down: look again at the next connect
	default:
		for _, p := range policies {
			if strings.HasPrefix(p, "allkeys-") {
				g.log.WarnContext(ctx, "cacheguard: redis evicts with maxmemory-policy "+p+": it may evict the bloom filter, "+
					"which the Guard then rebuilds from Filter.IDs (a full read, at most once a minute); run the Guard's "+
					"redis with volatile-lru or volatile-lfu, which evict only keys with a TTL (every value and marker has one, "+
					"the filter none; docs/usage.md, Redis users)", "policy", p)
				return
			}
		}
	}
}

// filter returns the Guard's bloom filter, opening it now if New could not
// (Redis was down then).
func (g *Guard) filter(ctx context.Context) (*bloom.Filter, error) {
	if f := g.bf.f.Load(); f != nil {
		return f, nil
	}
	if err := g.connect(ctx); err != nil {
		return nil, g.fail(ctx, "open", "", err)
	}
	return g.bf.f.Load(), nil
}

// connectLater keeps trying connect (retry's back-off: 100 ms doubling to
// 2 s) until it succeeds or the Guard closes, in a goroutine of the
// supervisor's. Until then Gets read the value alone (the filter fails
// open), without the local cache, or load through while Redis stays down.
func (g *Guard) connectLater() {
	g.retry(func(ctx context.Context) bool {
		ctx, cancel := context.WithTimeout(ctx, g.opts.Tuning.RedisTimeout)
		defer cancel()
		if g.connect(ctx) != nil {
			return false // retry ends the loop itself once Close cancelled ctx
		}
		g.log.Info("cacheguard: connected to redis")
		return true
	}, func() {}, nil)
}

// checkClient warns (once, at New) about client settings under which ctx
// deadlines do not bound a Get.
func (g *Guard) checkClient(ctx context.Context) {
	var ctxTimeouts bool
	var dialRetries int
	switch c := g.rdb.(type) {
	case *redis.Client:
		o := c.Options()
		ctxTimeouts, dialRetries = o.ContextTimeoutEnabled, o.DialerRetries
		if o.ClientSideCacheConfig != nil || o.ClientSideCache != nil {
			g.log.WarnContext(ctx, "cacheguard: the redis client has go-redis's client-side cache on: it may answer a Get's "+
				"read or a filter probe from a copy that Redis's invalidation has not reached yet, so a Get that starts "+
				"after a write (or an Add) may answer older data or \"not found\"; use a client without it (Options.Local "+
				"keeps copies with the same trade-off, documented)")
		}
	case *redis.ClusterClient:
		ctxTimeouts, dialRetries = c.Options().ContextTimeoutEnabled, c.Options().DialerRetries
	case *redis.Ring:
		ctxTimeouts, dialRetries = c.Options().ContextTimeoutEnabled, c.Options().DialerRetries
	default:
		return
	}
	g.rd.ctxBound = ctxTimeouts
	if !ctxTimeouts {
		g.log.WarnContext(
			ctx,
			"cacheguard: the redis client has ContextTimeoutEnabled off: each Get's read under a deadline runs "+
				"apart from its caller (a goroutine switch), so that the deadline holds (set ContextTimeoutEnabled: "+
				"true to save that)",
		)
	}
	if dialRetries != 1 {
		g.log.WarnContext(
			ctx,
			"cacheguard: the redis client retries failed dials (DialerRetries, default 5, with a pause "+
				"between tries): with Redis down each Get waits for them before it can load through (set "+
				"DialerRetries: 1)",
			"dialer_retries",
			dialRetries,
		)
	}
}

// Retry backoff: background work that fails (Redis not back yet, a source
// that failed) is tried again after retryMin, doubling up to retryMax, so
// it lands within seconds of Redis answering again.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 2 * time.Second
)

// retry runs attempt in a goroutine of the Guard's own until it reports
// done or the Guard closes, then end; a send on wake (if not nil) cuts a
// wait short. It is the one retry loop of the Guard's background work.
// Call it from inside the gate (or from New), so that Close, which shuts
// the gate before it waits, cannot miss one.
func (g *Guard) retry(attempt func(ctx context.Context) bool, end func(), wake <-chan struct{}) {
	if !g.sup.goLoop(func(ctx context.Context) {
		defer end()
		pause := backoff.New(retryMin, retryMax, false)
		for !attempt(ctx) {
			if pause.Wait(ctx, 0, wake) != nil {
				return
			}
		}
	}) {
		end()
	}
}

// Automatic rebuilds back off: after one starts, the next waits autoMin,
// doubling up to autoMax while they keep coming, across processes (a key
// that marks the last start: auto_rebuild.lua) and in this process (should
// an evicting Redis drop that key). A filter that Redis keeps losing costs the database one
// full read of its IDs per minute at most, not one per process and loss.
const (
	autoMin = time.Second
	autoMax = time.Minute
)

// autoRebuild makes sure a background rebuild from Options.Filter.IDs runs
// while the filter is not ready (or stale: Redis lost writes, lost.go): one at a time per
// Guard, until it lands, the filter is found ready, or the Guard closes.
// cause is logged with the rebuild.
func (g *Guard) autoRebuild(cause string) {
	if g.opts.Filter.IDs == nil || !g.bf.rebuilding.CompareAndSwap(false, true) {
		return
	}
	g.retry(func(ctx context.Context) bool { return g.rebuildOnce(ctx, cause) }, func() { g.bf.rebuilding.Store(false) }, nil)
}

// rebuildOnce makes one attempt: it reports whether the filter is ready now
// (rebuilt here or by another process) or there is nothing to do.
func (g *Guard) rebuildOnce(ctx context.Context, cause string) (done bool) {
	defer func() { // Filter.IDs is the application's code: a panic fails this attempt only
		if p := recover(); p != nil {
			g.log.Error("cacheguard: automatic bloom rebuild: Filter.IDs panicked", "panic", p)
			done = false
		}
	}()
	f, err := g.filter(ctx)
	if err != nil {
		return false // not connected yet: the next attempt opens it
	}
	if g.autoWaiting() {
		return false
	}
	stale := g.bf.stale.Load() // Redis restarted: rebuild even a ready filter
	ready := func() bool {     // reads the meta afresh: another process may have rebuilt it
		in, err := f.Info(ctx)
		return !stale && err == nil && in.Ready
	}
	if ready() {
		return true
	}
	if !g.mayAutoRebuild(ctx) {
		return false
	}
	// The source is called once the rebuild announced its generation, not
	// before: an ID created after the call then reaches the new generation
	// through its Add, whatever the source collects when it is called.
	src := func(yield func(string, error) bool) {
		for id, err := range g.opts.Filter.IDs(ctx) {
			if !yield(id, err) {
				return
			}
		}
	}
	start := time.Now()
	rebuilt, n, err := func() (bool, int, error) {
		g.bf.mu.Lock()
		defer g.bf.mu.Unlock() // a panic in Filter.IDs too
		// A Rebuild of this Guard's that held the lock may have made the
		// filter ready: a second rebuild would read every ID again for
		// nothing, and its switch would make reads fail open meanwhile.
		if ready() {
			return false, 0, nil
		}
		n, err := f.Rebuild(ctx, src, nil)
		if errors.Is(err, bloom.ErrTooSmall) { // the source outgrew the sizing: grow it, with room
			g.log.Warn("cacheguard: the ID source outgrew the bloom filter; rebuilding it larger", "ids", n, "expected_items", 2*n)
			n, err = f.Rebuild(ctx, src, &bloom.RebuildOptions{ExpectedItems: uint64(2 * n)})
		}
		return true, n, err
	}()
	switch {
	case !rebuilt:
		return true
	case err == nil:
		g.bf.stale.CompareAndSwap(stale, false)
		g.wakeCopy()
		g.log.Info("cacheguard: bloom filter rebuilt", "cause", cause, "ids", n, "took", time.Since(start).Round(time.Millisecond))
		return true
	case errors.Is(err, bloom.ErrRebuilding):
		g.log.Info("cacheguard: bloom filter is being rebuilt by another process")
	case errors.Is(err, bloom.ErrShortSource):
		g.log.Error("cacheguard: automatic bloom rebuild refused: Filter.IDs gave fewer than half the IDs the filter "+
			"holds (a query cut short?); the filter keeps its generation (after a mass delete, call Rebuild with Force)",
			"cause", cause, "err", err)
	case ctx.Err() != nil:
		return true // closing
	case g.refusal(err) != "":
		g.bf.refusedOnce.Do(func() { g.refused(ctx, "the automatic rebuild of the bloom filter", err) })
	default:
		g.log.Warn("cacheguard: automatic bloom rebuild failed; trying again", "cause", cause, "err", g.fail(ctx, "rebuild", "", err))
	}
	return false
}

// autoWaiting reports whether this Guard's back-off since its last
// automatic rebuild is still running.
func (g *Guard) autoWaiting() bool {
	g.bf.mu.Lock()
	defer g.bf.mu.Unlock()
	return time.Since(g.bf.lastAuto) < g.bf.autoWait
}

// mayAutoRebuild reports whether an automatic rebuild may start now: the
// back-off since the last start, here or in another process, is over
// (auto_rebuild.lua keeps it in Redis; autoWaiting, in this process, should
// an evicting Redis drop that key).
func (g *Guard) mayAutoRebuild(ctx context.Context) bool {
	wait, err := autoRebuildScript.Run(ctx, g.rdb, []string{g.keys.Filter().AutoRebuilt()},
		autoMin.Milliseconds(), autoMax.Milliseconds()).Int64()
	switch {
	case g.refusal(err) != "":
		g.bf.refusedOnce.Do(func() { g.refused(ctx, "the automatic rebuild of the bloom filter", err) })
		return false
	case err != nil:
		return false
	case wait == 0:
		g.log.Info("cacheguard: an automatic bloom rebuild started a moment ago (here or elsewhere); waiting before the next")
		return false
	}
	b := &g.bf
	b.mu.Lock()
	defer b.mu.Unlock()
	local := autoMin // this process's own back-off, should Redis have dropped the shared one
	if since := time.Since(b.lastAuto); b.autoWait > 0 && since <= 2*b.autoWait {
		local = min(2*b.autoWait, autoMax)
	}
	b.lastAuto, b.autoWait = time.Now(), max(time.Duration(wait)*time.Millisecond, local)
	return true
}

var (
	//go:embed lua/auto_rebuild.lua
	autoRebuildLua    string
	autoRebuildScript = redis.NewScript(autoRebuildLua)
)
