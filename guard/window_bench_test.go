package guard

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// BenchmarkInvalidationWindow measures the window Options.Local leaves
// between processes: a reader (a Guard on its own client) holds a copy of
// an ID, a writer (another Guard, another client) calls Set on it, and the
// benchmark times how long after Set returned the reader still held its
// copy, watching the reader's cache from a spinning goroutine. A negative
// window: the copy went before the write returned (the PUBLISH is part of
// the write's round trip). It reports the p50, p99 and max over b.N writes
// and the share dropped before the write returned.
//
//	go test -run '^$' -bench InvalidationWindow -benchtime 3000x ./guard
func BenchmarkInvalidationWindow(b *testing.B) {
	ctx := context.Background()
	c := redistest.Connect(b)
	open := func() *Guard {
		g, err := New(ctx, redistest.Connect(b), "window", &Options{
			KeyPrefix: c.Prefix,
			Local:     &LocalOptions{TTL: time.Minute},
			Filter:    FilterOptions{ExpectedItems: 1000},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = g.Close() })
		return g
	}
	writer, reader := open(), open()
	load := func(context.Context, string) (int, error) { return 0, nil }
	if err := writer.Add(ctx, "w"); err != nil {
		b.Fatal(err)
	}
	if err := Set(ctx, writer, "w", 0); err != nil {
		b.Fatal(err)
	}
	holds := func() bool { _, st := reader.local.get("w"); return st == localFresh }
	windows := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		// The reader keeps a copy: a Redis hit (the writer's Set stored the
		// entry), so no load of its own publishes anything.
		deadline := time.Now().Add(5 * time.Second)
		for !holds() {
			if v, err := Get(ctx, reader, "w", load); err != nil || v != i {
				b.Fatalf("reader: %d, %v, want %d", v, err, i)
			}
			if time.Now().After(deadline) {
				b.Fatal("the reader never kept a copy")
			}
		}
		returned := make(chan time.Time, 1)
		go func() {
			if err := Set(ctx, writer, "w", i+1); err != nil {
				b.Error(err)
			}
			returned <- time.Now()
		}()
		for holds() {
			if time.Now().After(deadline) {
				b.Fatal("the reader's copy outlived the write by seconds")
			}
			runtime.Gosched()
		}
		dropped := time.Now()
		windows = append(windows, dropped.Sub(<-returned))
	}
	b.StopTimer()
	slices.Sort(windows)
	early := 0
	for _, w := range windows {
		if w <= 0 {
			early++
		}
	}
	at := func(q float64) float64 { return float64(windows[int(q*float64(len(windows)-1))].Microseconds()) }
	b.ReportMetric(at(0.5), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(at(1), "max-µs")
	b.ReportMetric(100*float64(early)/float64(len(windows)), "%-before-return")
}
