package core_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheguard/cacheguard/adapters/internal/core"
	"github.com/cacheguard/cacheguard/guard"
)

func TestValidChars(t *testing.T) {
	def := core.ValidChars("")
	for id, want := range map[string]bool{
		"42": true, "0b9f3c1e-9d1a-4c2b-8f53-2f0c1a7d9e44": true, "a.b_c~d": true,
		"": false, ".": false, "..": false, "a/b": false, "a b": false, "{x}": false, "42:lock": false, "a@b.c": false, "\x00": false,
	} {
		if def(id) != want {
			t.Errorf("default rule on %q: %v", id, !want)
		}
	}
	wide := core.ValidChars("@+:\x00 ")
	for id, want := range map[string]bool{"ada+news@example.com": true, "user:1": true, "a\x00": false, "a b": false} {
		if wide(id) != want {
			t.Errorf(`rule "@+:" on %q: %v`, id, !want)
		}
	}
}

func TestStatusAndBodies(t *testing.T) {
	for err, want := range map[error]int{
		guard.ErrNotFound:                            404,
		fmt.Errorf("x: %w", guard.ErrInvalidKey):     400,
		guard.ErrBusy:                                503,
		fmt.Errorf("%w: dial", guard.ErrUnavailable): 503,
		errors.New("db password wrong"):              500,
	} {
		if got := core.Status(err); got != want {
			t.Errorf("Status(%v) = %d, want %d", err, got, want)
		}
	}
	for _, status := range []int{400, 404, 500, 503} {
		body := string(core.BodyFor(status))
		if body != string(core.Body(core.ProblemFor(status))) || !strings.Contains(body, http.StatusText(status)) {
			t.Errorf("body of %d: %s", status, body)
		}
	}
	if got := (*core.Request)(nil).RetryAfter(); got != "1" {
		t.Errorf("no middleware's Retry-After %q", got)
	}
	if (*core.Request)(nil).Failed(context.Background(), 500, errors.New("x")) {
		t.Error("no middleware: nothing to log through")
	}
}

func TestLoggable(t *testing.T) {
	if core.Loggable(nil) || core.Loggable(fmt.Errorf("get: %w", context.Canceled)) || !core.Loggable(errors.New("db down")) {
		t.Fatal("Loggable: nil and a client that went away are not worth a log line; other errors are")
	}
}
