package main

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheguard/cacheguard/internal/batch"
)

// batchedGet is raw's cache-aside with its concurrent GETs sharing
// pipelined round trips through the batcher cacheguard's reads use, and
// nothing else: no filter, lock or bookkeeping. It is a reference for the
// hit path alone: the least a go-redis client that shares round trips
// spends on a hit, so cacheguard's hits can be set against it.
type batchedGet struct {
	raw
	b *batch.Batcher[batchedReq]
}

// batchedReq is one GET in a batch: its key, then its command.
type batchedReq struct {
	key string
	get *redis.StringCmd
}

func newBatchedGet(r raw) *batchedGet {
	c := &batchedGet{raw: r}
	// Two round trips in flight at most, of up to 256 GETs: cacheguard's
	// defaults (readsInFlight, readBatchMax).
	c.b = batch.New(2, 256, func(ctx context.Context, calls []*batch.Call[batchedReq]) {
		if len(calls) == 1 {
			calls[0].Req.get = c.rdb.Get(ctx, calls[0].Req.key)
			return
		}
		pipe := c.rdb.Pipeline()
		for _, call := range calls {
			call.Req.get = pipe.Get(ctx, call.Req.key)
		}
		_, _ = pipe.Exec(ctx) // errors are read per command
	}, nil)
	return c
}

func (c *batchedGet) Get(ctx context.Context, id string, load Loader) (Value, error) {
	call := &batch.Call[batchedReq]{Req: batchedReq{key: c.RedisKey(id)}}
	if err := c.b.Do(ctx, call); err != nil {
		return Value{}, err
	}
	b, err := call.Req.get.Bytes()
	switch {
	case err == nil:
		var v Value
		return v, msgpack.Unmarshal(b, &v)
	case errors.Is(err, redis.Nil):
		return c.raw.Get(ctx, id, load) // a miss: raw's GET, load and SET
	}
	return Value{}, err
}
