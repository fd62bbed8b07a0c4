// Command cacheguard inspects and operates the Guards of a Redis: their
// bloom filters, their cached entries, their invalidation.
//
//	cacheguard [flags] info                       the filter: generation, fill, estimated FP rate, memory
//	cacheguard [flags] rebuild [file]             rebuild the filter from IDs, one per line (stdin without file)
//	cacheguard [flags] check <id>                 what the filter and the cache say of one ID
//	cacheguard [flags] get <id>                   the cached entry, decoded to JSON, with its TTL
//	cacheguard [flags] invalidate <id>...         drop cached entries (and cancel loads in flight)
//
// The connection comes from REDIS_URL (redis://user:password@host:6379/0,
// rediss:// for TLS; with -cluster, a cluster URL with addr= parameters), or
// from -addr, -user and REDIS_PASSWORD. -tls-ca adds a CA for rediss://.
// The Guard is -name under -prefix, as the application names it
// (guard.New(ctx, rdb, name, &guard.Options{KeyPrefix: prefix})).
//
// Exit codes: 0 done; 1 a failure (Redis, input); 2 a usage error; 3 not
// found (check: the filter says absent; get: no entry; info: no filter).
//
// Install: go install github.com/cacheguard/cacheguard/cmd/cacheguard@latest
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// quiet discards go-redis's internal log lines.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quiet{}) // go-redis logs dial retries; the command reports its own errors
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
