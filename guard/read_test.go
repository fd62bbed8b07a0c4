package guard

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/batch"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestLatestDeadline: a shared round trip runs until the latest of its
// callers' deadlines; one caller without a deadline leaves it to
// RedisTimeout (zero).
func TestLatestDeadline(t *testing.T) {
	now := time.Now()
	flight := func(d time.Time) *batch.Call[readReq] {
		return &batch.Call[readReq]{Req: readReq{deadline: d}}
	}
	for _, tc := range []struct {
		name  string
		calls []*batch.Call[readReq]
		want  time.Time
	}{
		{"one", []*batch.Call[readReq]{flight(now)}, now},
		{"latest wins", []*batch.Call[readReq]{flight(now), flight(now.Add(time.Second)), flight(now.Add(-time.Second))}, now.Add(time.Second)},
		{"one without", []*batch.Call[readReq]{flight(now), flight(time.Time{}), flight(now.Add(time.Second))}, time.Time{}},
		{"first without", []*batch.Call[readReq]{flight(time.Time{}), flight(now)}, time.Time{}},
	} {
		if got := latestDeadline(tc.calls); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestReadsOfOneKeyShareOneHGET: the reads of one key in a round trip share
// one HGET whether each asks for the bloom probe or not, and one probe
// answers every read that asks for it, the first read of the key going
// without it too, after a rebuild too. (Before, a read with the probe and
// one without each sent an HGET of their own.)
func TestReadsOfOneKeyShareOneHGET(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	e, err := New(ctx, c, "shared-reads", &Options{KeyPrefix: c.Prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := bind[string](e); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Rebuild(ctx, func(yield func(string, error) bool) { yield("p1", nil) }, nil); err != nil {
		t.Fatal(err)
	}
	vkey, err := e.keys.Value("p1")
	if err != nil {
		t.Fatal(err)
	}
	f := e.bf.f.Load()
	// A rebuild switches generations inside the Guard's one Filter, which
	// runReads relies on (a key's reads share one probe).
	if _, err := e.Rebuild(ctx, func(yield func(string, error) bool) { yield("p1", nil) }, nil); err != nil {
		t.Fatal(err)
	}
	if e.bf.f.Load() != f {
		t.Fatal("a rebuild replaced the Guard's Filter: the reads of one key would probe two")
	}
	read := func(probe bool) *batch.Call[readReq] {
		call := &batch.Call[readReq]{Req: readReq{id: "p1", vkey: vkey}}
		if probe {
			call.Req.f = f
		}
		return call
	}
	calls := []*batch.Call[readReq]{read(false), read(true), read(false), read(true)}
	c.Counter.Reset()
	e.runReads(ctx, calls)
	if n := c.Counter.Names(); n["hget"] != 1 || n["getrange"] != 1 {
		t.Fatalf("commands %v for four reads of one key, two with the probe: want one HGET and one GETRANGE", n)
	}
	for i, call := range calls {
		if err := call.Req.get.Err(); !errors.Is(err, redis.Nil) {
			t.Fatalf("read %d: %v, want redis.Nil (no entry)", i, err)
		}
		if call.Req.f == nil {
			continue
		}
		if maybe, err := call.Req.probe.Result(ctx); err != nil || !maybe {
			t.Fatalf("read %d: probe %v, %v, want maybe (p1 is in the filter)", i, maybe, err)
		}
	}
}
