package guard

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRateLimitedHandler: a cause writes its first record at once, holds
// the next back for logEvery, then writes one with the count; causes are
// apart, and handlers derived with attributes share the limits.
func TestRateLimitedHandler(t *testing.T) {
	var buf bytes.Buffer
	h := newRateLimited(slog.NewTextHandler(&buf, nil))
	log := slog.New(h.WithAttrs([]slog.Attr{slog.String("guard", "g")}))
	t0 := time.Now()
	emit := func(l *slog.Logger, at time.Duration, msg string) {
		r := slog.NewRecord(t0.Add(at), slog.LevelWarn, msg, 0)
		if err := l.Handler().Handle(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		emit(log, time.Duration(i)*time.Millisecond, "redis read failed")
	}
	emit(slog.New(h), 5*time.Millisecond, "redis write failed") // another cause
	emit(log, logEvery+time.Second, "redis read failed")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	if strings.Contains(lines[0], "suppressed") || !strings.Contains(lines[1], "write failed") ||
		!strings.Contains(lines[2], "suppressed=999") {
		t.Fatalf("lines:\n%s", buf.String())
	}
}

// TestRateLimitedPerSubject: one message about two routes (or tables) is
// two causes: the second route's warning within logEvery of the first's is
// written too, while a repeat about the first route, and the same message
// about other IDs, are held back. Control: keyed by the message alone, the
// second route's line is held back and the test fails.
func TestRateLimitedPerSubject(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(newRateLimited(slog.NewTextHandler(&buf, nil)))
	msg := "cacheguard: route has path wildcards but the middleware found no ID in it"
	log.Warn(msg, "route", "/a/:x")
	log.Warn(msg, "route", "/b/{y}")
	log.Warn(msg, "route", "/a/:x")
	log.Warn("inconsistent", "table", "products", "id", "1")
	log.Warn("inconsistent", "table", "orders", "id", "1")
	log.Warn("inconsistent", "table", "products", "id", "2")
	out := buf.String()
	if strings.Count(out, "route=") != 2 || !strings.Contains(out, "/b/{y}") || strings.Count(out, "table=") != 2 ||
		!strings.Contains(out, "table=orders") {
		t.Fatalf("want one line per route and per table:\n%s", out)
	}
}
