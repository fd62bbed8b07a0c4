package aside

import (
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/batch"
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
