// Command cacheguard inspects and operates the Guards of a Redis.
//
//	cacheguard [flags] info                the filter: generation, fill, FP rate, memory
//	cacheguard [flags] rebuild [file]      rebuild the filter from IDs, one per line
//	cacheguard [flags] check <id>          what the filter and the cache say of an ID
//	cacheguard [flags] get <id>            the cached entry as JSON, with its TTL
//	cacheguard [flags] invalidate <id>...  drop cached entries, void loads in flight
//
// The connection comes from REDIS_URL (rediss:// for TLS; -cluster for a
// cluster URL), or from -addr, -user and REDIS_PASSWORD; the Guard is -name
// under -prefix. Exit codes: 0 done, 1 a failure, 2 a usage error, 3 not
// found. docs/operations.md has the details.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
)

func main() {
	redis.SetLogger(guard.RedisLogger(slog.Default())) // go-redis's own lines: each kind once per 10 s, with a count
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
