package guard

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logEvery is how often one cause may write a line.
const logEvery = 10 * time.Second

// rateLimited is a slog.Handler that writes each cause (a record's level,
// message and subject: its "route" or "table", if any) at most once per
// logEvery: the first at once, the next one after the window with
// "suppressed", the count held back since the last line. An outage at
// thousands of Gets a second thus writes a few lines a minute, and the
// count says how large it was; a warning about one route or table never
// holds back another's. IDs are no subject: there may be millions.
type rateLimited struct {
	next  slog.Handler
	state *limits // shared by the handlers WithAttrs and WithGroup derive
}

// limits is the state of each cause; the zero value is ready to use.
type limits struct {
	mu     sync.Mutex // guards causes
	causes map[string]cause
}

type cause struct {
	last       time.Time // when a line of this cause was last written
	suppressed int       // records held back since
}

// admit reports whether a line of cause key at t is written, and how many
// were held back since the last one.
func (l *limits) admit(key string, t time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.causes == nil {
		l.causes = make(map[string]cause)
	}
	c := l.causes[key]
	if !c.last.IsZero() && t.Sub(c.last) < logEvery {
		c.suppressed++
		l.causes[key] = c
		return 0, false
	}
	l.causes[key] = cause{last: t}
	return c.suppressed, true
}

func newRateLimited(next slog.Handler) *rateLimited {
	return &rateLimited{next: next, state: &limits{}}
}

func (h *rateLimited) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *rateLimited) Handle(ctx context.Context, r slog.Record) error {
	key := r.Level.String() + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "route" || a.Key == "table" {
			key += "\x00" + a.Key + "=" + a.Value.String()
		}
		return true
	})
	n, ok := h.state.admit(key, r.Time)
	if !ok {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", n))
	}
	return h.next.Handle(ctx, r)
}

func (h *rateLimited) WithAttrs(as []slog.Attr) slog.Handler {
	return &rateLimited{next: h.next.WithAttrs(as), state: h.state}
}

func (h *rateLimited) WithGroup(name string) slog.Handler {
	return &rateLimited{next: h.next.WithGroup(name), state: h.state}
}

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
	return &redisLog{log: log, state: &limits{}}
}

// redisLog is RedisLogger's: go-redis's lines at WARN, each format (the
// cause, whatever its arguments) limited as rateLimited limits.
type redisLog struct {
	log   *slog.Logger
	state *limits
}

// Printf is redis.SetLogger's interface.
func (l *redisLog) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	now := time.Now()
	if !l.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	n, ok := l.state.admit(format, now)
	if !ok {
		return
	}
	r := slog.NewRecord(now, slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, v...)), 0)
	if n > 0 {
		r.AddAttrs(slog.Int("suppressed", n))
	}
	_ = l.log.Handler().Handle(ctx, r)
}
