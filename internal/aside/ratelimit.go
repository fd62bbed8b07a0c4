package aside

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logEvery is how often one cause may write a line: the first at once, then
// at most one per logEvery, carrying how many were held back.
const logEvery = 10 * time.Second

// rateLimited is a slog.Handler that writes each cause (a record's level
// and message) at most once per logEvery: the first at once, the next one
// after the window with "suppressed", the count held back since the last
// line. An outage at thousands of Gets a second thus writes a few lines a
// minute, and the count says how large it was.
type rateLimited struct {
	next  slog.Handler
	state *limits // shared by the handlers WithAttrs and WithGroup derive
}

type limits struct {
	mu     sync.Mutex // guards causes
	causes map[string]*cause
}

type cause struct {
	last       time.Time // when a line of this cause was last written
	suppressed int       // records held back since
}

func newRateLimited(next slog.Handler) *rateLimited {
	return &rateLimited{next: next, state: &limits{causes: make(map[string]*cause)}}
}

func (h *rateLimited) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *rateLimited) Handle(ctx context.Context, r slog.Record) error {
	key := r.Level.String() + r.Message
	h.state.mu.Lock()
	c := h.state.causes[key]
	if c == nil {
		c = &cause{}
		h.state.causes[key] = c
	}
	if !c.last.IsZero() && r.Time.Sub(c.last) < logEvery {
		c.suppressed++
		h.state.mu.Unlock()
		return nil
	}
	n := c.suppressed
	c.last, c.suppressed = r.Time, 0
	h.state.mu.Unlock()
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
