package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	zbloom "github.com/zeromicro/go-zero/core/bloom"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/cacheguard/cacheguard/guard"
)

// env is what every workload runs against.
type env struct {
	addr    string
	admin   *redis.Client // the runner's own client: INFO, PTTL, counters
	run     string        // unique per runner invocation
	hitTime time.Duration
}

func (e *env) build(ctx context.Context, name, workload string, ttl time.Duration, existing []string) (Contender, *counter, error) {
	ctr := &counter{}
	c, err := newContender(ctx, name, setup{addr: e.addr, prefix: e.prefix(name, workload), ttl: ttl, existing: existing, counter: ctr})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, ctr, nil
}

func (e *env) prefix(name, workload string) string {
	r := strings.NewReplacer("/", "_", "+", "_")
	return "b" + e.run + ":" + workload + ":" + r.Replace(name)
}

// serverCommands is Redis's total_commands_processed.
func (e *env) serverCommands(ctx context.Context) (int64, error) {
	info, err := e.admin.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no total_commands_processed in INFO")
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// parallel runs fn(0..n-1) on w goroutines and returns the first error.
func parallel(n, w int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

// PenetrationResult: workload 2.
type PenetrationResult struct {
	Contender   string
	Requests    int
	LoaderCalls int64
	OpsPerSec   float64
}

// penetration: 20,000 distinct nonexistent IDs against 10,000 existing ones.
func penetration(ctx context.Context, e *env, name string) (PenetrationResult, error) {
	existing := ids("k", 10_000)
	c, _, err := e.build(ctx, name, "pen", 10*time.Minute, existing)
	if err != nil {
		return PenetrationResult{}, err
	}
	defer c.Close()
	var calls atomic.Int64
	load := func(ctx context.Context, id string) (Value, error) {
		calls.Add(1)
		if strings.HasPrefix(id, "k") {
			return value(id), nil
		}
		return Value{}, errNotFound
	}
	missing := ids("missing-", 20_000)
	start := time.Now()
	err = parallel(len(missing), 64, func(i int) error {
		_, err := c.Get(ctx, missing[i], load)
		if !isNotFound(err) {
			return fmt.Errorf("%s: %s: want not found, got %v", name, missing[i], err)
		}
		return nil
	})
	if err != nil {
		return PenetrationResult{}, err
	}
	return PenetrationResult{Contender: name, Requests: len(missing), LoaderCalls: calls.Load(),
		OpsPerSec: float64(len(missing)) / time.Since(start).Seconds()}, nil
}

// AvalancheResult: workload 5.
type AvalancheResult struct {
	Contender string
	Keys      int
	TTL       time.Duration
	Min, Max  time.Duration
	StdDev    time.Duration
	Spread    float64 // (max − min) / TTL
}

// avalanche: 5,000 keys loaded at once; how are their TTLs spread?
func avalanche(ctx context.Context, e *env, name string) (AvalancheResult, error) {
	const ttl = 10 * time.Minute
	keys := ids("a", 5000)
	c, _, err := e.build(ctx, name, "aval", ttl, keys)
	if err != nil {
		return AvalancheResult{}, err
	}
	defer c.Close()
	load := func(ctx context.Context, id string) (Value, error) { return value(id), nil }
	if err := parallel(len(keys), 64, func(i int) error { _, err := c.Get(ctx, keys[i], load); return err }); err != nil {
		return AvalancheResult{}, fmt.Errorf("%s: %w", name, err)
	}
	pipe := e.admin.Pipeline()
	cmds := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.PTTL(ctx, c.RedisKey(k))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return AvalancheResult{}, err
	}
	r := AvalancheResult{Contender: name, Keys: len(keys), TTL: ttl, Min: time.Duration(math.MaxInt64)}
	var sum, sq float64
	for i, cmd := range cmds {
		d := cmd.Val()
		if d <= 0 {
			return AvalancheResult{}, fmt.Errorf("%s: key %s has PTTL %v", name, c.RedisKey(keys[i]), d)
		}
		r.Min, r.Max = min(r.Min, d), max(r.Max, d)
		sum += float64(d)
		sq += float64(d) * float64(d)
	}
	n := float64(len(cmds))
	r.StdDev = time.Duration(math.Sqrt(max(sq/n-(sum/n)*(sum/n), 0)))
	r.Spread = float64(r.Max-r.Min) / float64(ttl)
	return r, nil
}

// MemoryResult: workload 6.
type MemoryResult struct {
	Filter        string
	Items         int
	TargetFP      float64
	Bytes         int64
	BoundBytes    float64 // n·log2(1/p)/8
	VsBound       float64
	MeasuredFP    float64
	BitsPerItem   float64
	TestedAbsents int
}

// memory: bytes in Redis for 1,000,000 IDs in each bloom filter at a 1%
// target, and the false-positive rate measured over 100,000 absent IDs.
func memory(ctx context.Context, e *env) ([]MemoryResult, error) {
	const n, absents, p = 1_000_000, 100_000, 0.01
	bound := n * math.Log2(1/p) / 8
	items := ids("m", n)
	absent := ids("x", absents)
	var out []MemoryResult

	// cacheguard: sized from n and p.
	rdb := redis.NewClient(&redis.Options{Addr: e.addr})
	defer rdb.Close()
	g, err := guard.New(
		ctx,
		rdb,
		"mem",
		&guard.Options{KeyPrefix: e.prefix("cacheguard", "mem"), Filter: guard.FilterOptions{ExpectedItems: n, FalsePositiveRate: p}},
	)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, func(yield func(string, error) bool) {
		for _, id := range items {
			if !yield(id, nil) {
				return
			}
		}
	}, nil); err != nil {
		return nil, err
	}
	in, err := g.Info(ctx)
	if err != nil {
		return nil, err
	}
	var fp atomic.Int64
	if err := parallel(absents, 32, func(i int) error {
		ok, err := g.MayExist(ctx, absent[i])
		if ok {
			fp.Add(1)
		}
		return err
	}); err != nil {
		return nil, err
	}
	out = append(out, MemoryResult{Filter: "cacheguard (n=1e6, p=1%)", Items: n, TargetFP: p, Bytes: in.MemoryBytes,
		BoundBytes: bound, VsBound: float64(in.MemoryBytes) / bound, MeasuredFP: float64(fp.Load()) / absents,
		BitsPerItem: float64(in.Config.Bits) / n, TestedAbsents: absents})

	// go-zero: k is fixed at 14; its docs advise bits = 20 × elements.
	rds := zredis.New(e.addr, zredis.WithIdentity())
	key := e.prefix("go-zero", "mem") + ":bloom"
	f := zbloom.New(rds, key, 20*n)
	// One call of each script first, alone: go-zero's client counts the
	// NOSCRIPT of a script's first EVALSHA as a failure, and 64 of them at
	// once open its circuit breaker (a run whose -only left out
	// go-zero+bloom, which otherwise loads both scripts earlier).
	if err := f.AddCtx(ctx, []byte(items[0])); err != nil {
		return nil, err
	}
	if _, err := f.ExistsCtx(ctx, []byte(absent[0])); err != nil {
		return nil, err
	}
	if err := parallel(n, 64, func(i int) error { return f.AddCtx(ctx, []byte(items[i])) }); err != nil {
		return nil, err
	}
	bytes, err := e.admin.MemoryUsage(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	fp.Store(0)
	if err := parallel(absents, 32, func(i int) error {
		ok, err := f.ExistsCtx(ctx, []byte(absent[i]))
		if ok {
			fp.Add(1)
		}
		return err
	}); err != nil {
		return nil, err
	}
	out = append(out, MemoryResult{Filter: "go-zero bloom (20 bits/item, k=14, as its docs advise)", Items: n, TargetFP: p, Bytes: bytes,
		BoundBytes: bound, VsBound: float64(bytes) / bound, MeasuredFP: float64(fp.Load()) / absents,
		BitsPerItem: 20, TestedAbsents: absents})
	return out, nil
}
