package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	gocache "github.com/go-redis/cache/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisaside"
	"github.com/vmihailenco/msgpack/v5"
	zbloom "github.com/zeromicro/go-zero/core/bloom"
	zcache "github.com/zeromicro/go-zero/core/stores/cache"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/core/syncx"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/cmdcount"
)

// counter counts round trips and commands on a contender's client.
type counter = cmdcount.Counter

// Value is what every contender caches: a typical small row.
type Value struct {
	ID    string
	Name  string
	Price int64
	Tags  []string
}

// errNotFound is what the source of truth answers for a missing ID; each
// contender is told about it in its own way.
var errNotFound = errors.New("not found")

// Loader is the source of truth.
type Loader func(ctx context.Context, id string) (Value, error)

// Contender is one way of reading through a Redis cache.
type Contender interface {
	Get(ctx context.Context, id string, load Loader) (Value, error)
	// RedisKey is where the contender keeps id's value (for TTL checks).
	RedisKey(id string) string
	Close()
}

// setup is what every contender is built from.
type setup struct {
	addr     string // Redis host:port
	prefix   string // unique per run and contender
	ttl      time.Duration
	existing []string // IDs that exist (bloom-filtered contenders load them)
	counter  *counter // counts round trips and commands on the contender's client
	// opened: the filters were built by another process; size them from
	// existing but do not load them again.
	opened bool
}

var contenderNames = []string{"raw", "rueidis", "go-zero", "go-zero+bloom", "go-redis/cache", "go-redis/cache+local", "rueidis+client-cache",
	"rueidisaside", "cacheguard", "cacheguard+local", "cacheguard+refresh", "cacheguard+local+refresh"}

// hitReferences run on the hit path alone, in its rotation with the
// contenders: floors to set them against, not libraries a user would pick.
// go-redis+autopipeline and go-redis+client-cache are what go-redis itself
// offers with one option (both experimental in v9.23); the second is also
// the reference of the staleness workload (stale.go). cacheguard+plain-client
// is cacheguard on a client set up otherwise than the docs say (go-redis's
// defaults): what skipping usage.md's client settings costs.
var hitReferences = []string{"go-redis+batch", "go-redis+autopipeline", "go-redis+client-cache", "cacheguard+plain-client"}

func newContender(ctx context.Context, name string, s setup) (Contender, error) {
	switch name {
	case "raw":
		rdb := redis.NewClient(&redis.Options{Addr: s.addr})
		rdb.AddHook(s.counter)
		return &raw{rdb: rdb, prefix: s.prefix, ttl: s.ttl}, nil
	case "go-redis+batch":
		rdb := redis.NewClient(&redis.Options{Addr: s.addr})
		rdb.AddHook(s.counter)
		return newBatchedGet(raw{rdb: rdb, prefix: s.prefix, ttl: s.ttl}), nil
	case "go-redis+autopipeline":
		// raw's cache-aside with its GETs through go-redis's blocking
		// autopipeliner (Client.AutoPipeline, default options): concurrent
		// callers' commands share pipelined round trips.
		rdb := redis.NewClient(&redis.Options{Addr: s.addr})
		rdb.AddHook(s.counter)
		ap, err := rdb.AutoPipeline()
		if err != nil {
			_ = rdb.Close()
			return nil, err
		}
		return &autoPiped{raw: raw{rdb: rdb, prefix: s.prefix, ttl: s.ttl}, ap: ap}, nil
	case "go-redis+client-cache":
		// raw on a client with go-redis's client-side cache (RESP3, CLIENT
		// TRACKING: Redis invalidates the copies), 10,000 entries as its
		// README sets it up and as cacheguard's Local keeps by default. No
		// counting hook: go-redis runs hooks before the cache answers, so
		// every local hit would count as a round trip.
		rdb := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 3,
			ClientSideCacheConfig: &redis.ClientSideCacheConfig{MaxEntries: 10_000}})
		return &raw{rdb: rdb, prefix: s.prefix, ttl: s.ttl}, nil
	case "go-zero", "go-zero+bloom":
		// WithIdentity sets go-redis DisableIdentity (RedisConf.DisableIdentity):
		// redis-server 7.0 rejects CLIENT SETINFO, and go-zero's breaker counts
		// that handshake error as a failure.
		rds := zredis.New(s.addr, zredis.WithHook(s.counter), zredis.WithIdentity())
		c := &goZero{rds: rds, prefix: s.prefix,
			c: zcache.NewNode(rds, syncx.NewSingleFlight(), zcache.NewStat(s.prefix), errNotFound,
				zcache.WithExpiry(s.ttl), zcache.WithNotFoundExpiry(time.Minute))}
		if name == "go-zero+bloom" {
			// As go-zero's bloom docs advise: bits = 20 × elements (k is fixed at 14).
			c.bloom = zbloom.New(rds, s.prefix+":bloom", uint(20*max(len(s.existing), 1)))
			if s.opened {
				return c, nil
			}
			if err := parallel(len(s.existing), 32, func(i int) error { return c.bloom.AddCtx(ctx, []byte(s.existing[i])) }); err != nil {
				return nil, err
			}
		}
		return c, nil
	case "go-redis/cache", "go-redis/cache+local":
		rdb := redis.NewClient(&redis.Options{Addr: s.addr})
		rdb.AddHook(s.counter)
		o := &gocache.Options{Redis: rdb}
		if name == "go-redis/cache+local" {
			o.LocalCache = gocache.NewTinyLFU(10_000, s.ttl)
		}
		return &goRedisCache{rdb: rdb, c: gocache.New(o), prefix: s.prefix, ttl: s.ttl}, nil
	case "rueidis", "rueidis+client-cache":
		// rueidis: raw's cache-aside on rueidis, whose concurrent commands
		// share round trips (auto-pipelining). rueidis+client-cache:
		// cache-aside on its server-assisted client-side caching (DoCache:
		// CLIENT TRACKING, RESP3), what rueidisaside builds on, without its
		// lock: no loader dedup.
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.addr}})
		if err != nil {
			return nil, err
		}
		return &rueidisCache{c: c, prefix: s.prefix, ttl: s.ttl, tracked: name == "rueidis+client-cache"}, nil
	case "rueidisaside":
		// redis/rueidis's cache-aside: server-assisted client-side caching
		// (CLIENT TRACKING, RESP3) on by default, a per-key lock in Redis
		// (SET NX GET of a placeholder) so one process loads a key, and the
		// others wait for the key's invalidation. Not-found is cached the way
		// its users do it: an empty value, here for a minute as go-zero does.
		c, err := rueidisaside.NewClient(rueidisaside.ClientOption{
			ClientOption: rueidis.ClientOption{InitAddress: []string{s.addr}}})
		if err != nil {
			return nil, err
		}
		return &rueidisAside{c: c, prefix: s.prefix, ttl: s.ttl}, nil
	case "cacheguard", "cacheguard+local", "cacheguard+refresh", "cacheguard+local+refresh", "cacheguard+plain-client":
		// The client as the README sets it up: ctx deadlines bound its reads
		// (with a default client each read under a deadline runs detached
		// and its caller waits on a timer, so that the deadline holds), dials
		// fail fast.
		rdb := redis.NewClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true, DialerRetries: 1})
		if name == "cacheguard+plain-client" {
			rdb = redis.NewClient(&redis.Options{Addr: s.addr})
		}
		rdb.AddHook(s.counter)
		o := &guard.Options{KeyPrefix: s.prefix, TTL: s.ttl}
		switch name {
		case "cacheguard+local":
			o.Local = &guard.LocalOptions{} // defaults: 10,000 values for 1 s
		case "cacheguard+refresh":
			o.RefreshAhead = true // refresh from 85% of the TTL
		case "cacheguard+local+refresh":
			o.Local, o.RefreshAhead = &guard.LocalOptions{}, true
		}
		g, err := guard.New(ctx, rdb, "bench", o)
		if err != nil {
			return nil, err
		}
		if s.opened {
			return &cacheguard{rdb: rdb, g: g, prefix: s.prefix}, nil
		}
		ids := func(yield func(string, error) bool) {
			for _, id := range s.existing {
				if !yield(id, nil) {
					return
				}
			}
		}
		if _, err := g.Rebuild(ctx, ids, nil); err != nil {
			return nil, err
		}
		return &cacheguard{rdb: rdb, g: g, prefix: s.prefix}, nil
	}
	return nil, fmt.Errorf("unknown contender %q", name)
}

// raw: GET; on a miss load and SET. No protection of any kind.
type raw struct {
	rdb    *redis.Client
	prefix string
	ttl    time.Duration
}

func (r *raw) RedisKey(id string) string { return r.prefix + ":" + id }
func (r *raw) Close()                    { _ = r.rdb.Close() }
func (r *raw) Get(ctx context.Context, id string, load Loader) (Value, error) {
	var v Value
	b, err := r.rdb.Get(ctx, r.RedisKey(id)).Bytes()
	if err == nil {
		return v, msgpack.Unmarshal(b, &v)
	}
	if !errors.Is(err, redis.Nil) {
		return v, err
	}
	if v, err = load(ctx, id); err != nil {
		return v, err
	}
	b, err = msgpack.Marshal(v)
	if err != nil {
		return v, err
	}
	return v, r.rdb.Set(ctx, r.RedisKey(id), b, r.ttl).Err()
}

// autoPiped: raw's cache-aside, its GET sent through go-redis's
// autopipeliner; a miss is raw's (GET, load, SET).
type autoPiped struct {
	raw
	ap *redis.AutoPipeliner
}

func (a *autoPiped) Close() { _ = a.ap.Close(); a.raw.Close() }
func (a *autoPiped) Get(ctx context.Context, id string, load Loader) (Value, error) {
	b, err := a.ap.Get(ctx, a.RedisKey(id)).Bytes()
	switch {
	case err == nil:
		var v Value
		return v, msgpack.Unmarshal(b, &v)
	case errors.Is(err, redis.Nil):
		return a.raw.Get(ctx, id, load)
	}
	return Value{}, err
}

// goZero: go-zero core/stores/cache TakeCtx (singleflight in-process, "*"
// placeholder for not-found, ±5% expiry), optionally behind go-zero's bloom.
type goZero struct {
	rds    *zredis.Redis
	c      zcache.Cache
	bloom  *zbloom.Filter
	prefix string
}

func (z *goZero) RedisKey(id string) string { return z.prefix + ":" + id }
func (z *goZero) Close()                    {}
func (z *goZero) Get(ctx context.Context, id string, load Loader) (Value, error) {
	var v Value
	if z.bloom != nil {
		ok, err := z.bloom.ExistsCtx(ctx, []byte(id))
		if err != nil {
			return v, err
		}
		if !ok {
			return v, errNotFound
		}
	}
	err := z.c.TakeCtx(ctx, &v, z.RedisKey(id), func(val any) error {
		got, err := load(ctx, id)
		if err != nil {
			return err
		}
		*val.(*Value) = got
		return nil
	})
	return v, err
}

// goRedisCache: github.com/go-redis/cache/v9 Once (singleflight in-process),
// optionally with its local TinyLFU.
type goRedisCache struct {
	rdb    *redis.Client
	c      *gocache.Cache
	prefix string
	ttl    time.Duration
}

func (g *goRedisCache) RedisKey(id string) string { return g.prefix + ":" + id }
func (g *goRedisCache) Close()                    { _ = g.rdb.Close() }
func (g *goRedisCache) Get(ctx context.Context, id string, load Loader) (Value, error) {
	var v Value
	err := g.c.Once(&gocache.Item{Ctx: ctx, Key: g.RedisKey(id), Value: &v, TTL: g.ttl,
		Do: func(*gocache.Item) (any, error) { return load(ctx, id) }})
	return v, err
}

// cacheguard: guard.Get with default options (TTL set like the others).
type cacheguard struct {
	rdb    *redis.Client
	g      *guard.Guard
	prefix string
}

func (c *cacheguard) RedisKey(id string) string { return c.prefix + ":bench:{" + id + "}" }
func (c *cacheguard) Close()                    { _ = c.g.Close(); _ = c.rdb.Close() }
func (c *cacheguard) Get(ctx context.Context, id string, load Loader) (Value, error) {
	return guard.Get(ctx, c.g, id, func(ctx context.Context, id string) (Value, error) {
		v, err := load(ctx, id)
		if errors.Is(err, errNotFound) {
			return v, fmt.Errorf("%w: %w", guard.ErrNotFound, err)
		}
		return v, err
	})
}

// rueidisCache: a GET (Do, or DoCache: client-side cached); on a miss load
// and SET.
type rueidisCache struct {
	c       rueidis.Client
	prefix  string
	ttl     time.Duration
	tracked bool // GET through the client-side cache (DoCache), not Do
}

func (r *rueidisCache) RedisKey(id string) string { return r.prefix + ":" + id }
func (r *rueidisCache) Close()                    { r.c.Close() }
func (r *rueidisCache) Get(ctx context.Context, id string, load Loader) (Value, error) {
	key := r.RedisKey(id)
	var b []byte
	var err error
	if r.tracked {
		b, err = r.c.DoCache(ctx, r.c.B().Get().Key(key).Cache(), r.ttl).AsBytes()
	} else {
		b, err = r.c.Do(ctx, r.c.B().Get().Key(key).Build()).AsBytes()
	}
	if err == nil {
		var v Value
		return v, msgpack.Unmarshal(b, &v)
	}
	if !rueidis.IsRedisNil(err) {
		return Value{}, err
	}
	v, err := load(ctx, id)
	if err != nil {
		return v, err
	}
	raw, err := msgpack.Marshal(v)
	if err != nil {
		return v, err
	}
	return v, r.c.Do(ctx, r.c.B().Set().Key(key).Value(rueidis.BinaryString(raw)).Px(r.ttl).Build()).Error()
}

// rueidisAside: rueidisaside.Client.Get; the value is msgpack in a string,
// "" stands for "not found".
type rueidisAside struct {
	c      rueidisaside.CacheAsideClient
	prefix string
	ttl    time.Duration
}

func (r *rueidisAside) RedisKey(id string) string { return r.prefix + ":" + id }
func (r *rueidisAside) Close()                    { r.c.Close() }
func (r *rueidisAside) Get(ctx context.Context, id string, load Loader) (Value, error) {
	var v Value
	s, err := r.c.Get(ctx, r.ttl, r.RedisKey(id), func(ctx context.Context, _ string) (string, error) {
		v, err := load(ctx, id)
		if errors.Is(err, errNotFound) {
			rueidisaside.OverrideCacheTTL(ctx, time.Minute)
			return "", nil
		}
		if err != nil {
			return "", err
		}
		b, err := msgpack.Marshal(v)
		return string(b), err
	})
	if err != nil {
		return v, err
	}
	if s == "" {
		return v, errNotFound
	}
	// Decoded in place: msgpack only reads the bytes (a copy would cost the
	// peer an allocation per hit).
	return v, msgpack.Unmarshal(unsafe.Slice(unsafe.StringData(s), len(s)), &v)
}

// isNotFound tells a contender's "not found" from a failure.
func isNotFound(err error) bool {
	return errors.Is(err, errNotFound) || errors.Is(err, guard.ErrNotFound)
}

// value builds the row for id.
func value(id string) Value {
	n, _ := strconv.Atoi(id[max(0, len(id)-4):])
	return Value{ID: id, Name: "product " + id, Price: int64(100 + n), Tags: []string{"bench", "cache"}}
}
