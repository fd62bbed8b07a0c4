package guard

import (
	"context"
	"log/slog"

	"github.com/cacheguard/cacheguard/internal/aside"
)

// RedisLogger returns a logger for go-redis's own lines (dial failures, pool
// trouble) that writes them to log at WARN, each kind at most once per 10 s
// with a count of those held back ("suppressed"), as a Guard's logger does:
//
//	redis.SetLogger(guard.RedisLogger(logger))
func RedisLogger(log *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	if log == nil {
		log = slog.Default()
	}
	return aside.NewRedisLog(log)
}
