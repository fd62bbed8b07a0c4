// Package cmdcount is a redis.Hook that counts what a go-redis client sends:
// round trips (a single command or a whole pipeline is one), commands, and
// commands by name. A new connection's hand-shake (HELLO, CLIENT SETINFO,
// AUTH, SELECT, READONLY) is not counted. Tests assert on it, the quickstart and the demo shop
// print it, the benchmarks divide by it.
package cmdcount

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Counter is safe for concurrent use; the zero value is ready.
type Counter struct {
	trips, cmds atomic.Int64
	mu          sync.Mutex // guards names
	names       map[string]int
}

// RoundTrips is the number of round trips since the last Reset.
func (c *Counter) RoundTrips() int64 { return c.trips.Load() }

// Commands is the number of commands since the last Reset.
func (c *Counter) Commands() int64 { return c.cmds.Load() }

// Names returns how often each command name was sent since the last Reset.
func (c *Counter) Names() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.names))
	for k, v := range c.names {
		out[k] = v
	}
	return out
}

// Reset zeroes the counts.
func (c *Counter) Reset() {
	c.trips.Store(0)
	c.cmds.Store(0)
	c.mu.Lock()
	c.names = nil
	c.mu.Unlock()
}

// handshake lists what go-redis sends when it dials a connection; a hook sees
// it too, but it is no part of what the code under test sends.
var handshake = map[string]bool{"hello": true, "client": true, "auth": true, "select": true, "readonly": true}

func (c *Counter) note(cmds []redis.Cmder) {
	if len(cmds) > 0 && handshake[cmds[0].Name()] {
		return
	}
	c.trips.Add(1)
	c.cmds.Add(int64(len(cmds)))
	c.mu.Lock()
	if c.names == nil {
		c.names = map[string]int{}
	}
	for _, cmd := range cmds {
		c.names[cmd.Name()]++
	}
	c.mu.Unlock()
}

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.note([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.note(cmds)
		return next(ctx, cmds)
	}
}
