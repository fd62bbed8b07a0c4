package bloom_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestMillionItemsSharded: n = 1,000,000 at p = 1% in 4+ shards. No false
// negative among the million, a false-positive rate within [0.7%, 1.3%]
// over 250,000 absent IDs (about 2,500 expected: the bounds are some 12
// standard deviations away), and each probe one command.
func TestMillionItemsSharded(t *testing.T) {
	if testing.Short() {
		t.Skip("a million IDs: make test")
	}
	t.Parallel() // its own keys: runs beside the other slow one
	ctx := context.Background()
	c := redistest.Connect(t)
	opts := &bloom.Options{ExpectedItems: 1_000_000, FalsePositiveRate: 0.01, MaxShardBytes: 256 << 10}
	f, err := bloom.Open(ctx, c, c.Prefix+":bf", opts)
	if err != nil {
		t.Fatal(err)
	}
	if f.Config().Shards < 4 {
		t.Fatalf("want >= 4 shards: %+v", f.Config())
	}
	const n = 1_000_000
	if _, err := f.Rebuild(ctx, seq("id-", n), nil); err != nil {
		t.Fatal(err)
	}
	const batch, absent = 20_000, 250_000
	fp := 0
	for _, pass := range []string{"id-", "absent-"} {
		for from := 0; from < map[string]int{"id-": n, "absent-": absent}[pass]; from += batch {
			got, err := f.TestMany(ctx, ids(pass, from, from+batch))
			if err != nil {
				t.Fatal(err)
			}
			for i, ok := range got {
				if pass == "id-" && !ok {
					t.Fatalf("false negative for id-%d", from+i)
				}
				if pass == "absent-" && ok {
					fp++
				}
			}
		}
	}
	rate := float64(fp) / absent
	c.Counter.Reset()
	if _, err := f.Test(ctx, "id-1"); err != nil {
		t.Fatal(err)
	}
	if c.Counter.Commands() != 1 {
		t.Fatalf("a probe sent %d commands", c.Counter.Commands())
	}
	in, err := f.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("n=1e6 p=1%% in %d shards: measured FP %.3f%%; Info: fill %.3f, estimated items %.0f, estimated FP %.3f%%, memory %d bytes (m/8 = %d)",
		f.Config().Shards, rate*100, in.FillRatio, in.EstimatedItems, in.EstimatedFPRate*100, in.MemoryBytes, in.Config.Bits/8)
	if rate < 0.007 || rate > 0.013 {
		t.Fatalf("false-positive rate %.3f%% outside [0.7%%, 1.3%%]", rate*100)
	}
	if !in.Ready || in.EstimatedItems < 0.97*n || in.EstimatedItems > 1.03*n {
		t.Fatalf("Info %+v", in)
	}
}

// db is a growing list of IDs: the source of truth for rebuild tests.
type db struct {
	mu  sync.Mutex
	ids []string
}

func (d *db) insert(id string) {
	d.mu.Lock()
	d.ids = append(d.ids, id)
	d.mu.Unlock()
}

func (d *db) snapshot() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ids[:len(d.ids):len(d.ids)]
}

// scan lists the IDs committed when the scan starts, like a SELECT would.
func (d *db) scan() iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for _, id := range d.snapshot() {
			if !yield(id, nil) {
				return
			}
		}
	}
}

// TestRebuildUnderLoad: while rebuilds run (one of them resizing), writers
// keep inserting and adding IDs and readers, on other clients, keep testing
// every ID added so far: no ID is ever reported absent.
func TestRebuildUnderLoad(t *testing.T) {
	ctx := context.Background()
	c := redistest.Connect(t)
	key := c.Prefix + ":bf"
	opts := &bloom.Options{ExpectedItems: 100_000, MaxShardBytes: 16 << 10}
	open := func() *bloom.Filter {
		f, err := bloom.Open(ctx, redistest.Connect(t), key, opts)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	builder, writer, reader := open(), open(), open()
	d := &db{}
	for i := range 50_000 {
		d.insert(fmt.Sprintf("k%d", i))
	}
	if _, err := builder.Rebuild(ctx, d.scan(), nil); err != nil {
		t.Fatal(err)
	}

	var added atomic.Int64 // IDs k0..k(added-1) are committed and added
	added.Store(50_000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var falseNeg, probes, notReady atomic.Int64
	fail := make(chan error, 8)
	wg.Add(1)
	go func() { // writer: INSERT, then Add
		defer wg.Done()
		for i := 50_000; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("k%d", i)
			d.insert(id)
			if err := writer.Add(ctx, id); err != nil {
				fail <- err
				return
			}
			added.Store(int64(i + 1))
		}
	}()
	for r := range 2 {
		wg.Add(1)
		go func() { // readers: every ID added so far, in windows
			defer wg.Done()
			for w := 0; ; w++ {
				select {
				case <-stop:
					return
				default:
				}
				hi := int(added.Load())
				lo := (w*997 + r*5000) % max(hi-2000, 1)
				got, err := reader.TestMany(ctx, ids("k", lo, min(lo+2000, hi)))
				if errors.Is(err, bloom.ErrNotReady) {
					notReady.Add(1) // failing open is allowed; a wrong "absent" is not
					continue
				}
				if err != nil {
					fail <- err
					return
				}
				for i, ok := range got {
					probes.Add(1)
					if !ok {
						falseNeg.Add(1)
						fail <- fmt.Errorf("k%d reported absent", lo+i)
						return
					}
				}
			}
		}()
	}
	// Between rebuilds, until the readers have probed 2,000 more IDs and the
	// writer added 100 more: each rebuild runs under live reads and Adds.
	running := func() {
		p, a := probes.Load(), added.Load()
		eventually(t, 10*time.Second, "reads and Adds under way", func() bool {
			return probes.Load() >= p+2000 && added.Load() >= a+100 || len(fail) > 0
		})
	}
	for i, ro := range []*bloom.RebuildOptions{nil, {ExpectedItems: 200_000}, nil} {
		running()
		n, err := builder.Rebuild(ctx, d.scan(), ro)
		if err != nil {
			t.Fatalf("rebuild %d: %v", i, err)
		}
		t.Logf("rebuild %d: %d IDs, layout now %+v", i, n, builder.Config())
	}
	running()
	close(stop)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatal(err)
	}
	// Everything added, checked once more after the last switch.
	final := d.snapshot()
	var got []bool
	var err error
	eventually(t, 5*time.Second, "the reader to follow the last switch (its next reload)", func() bool {
		got, err = reader.TestMany(ctx, final)
		return !errors.Is(err, bloom.ErrNotReady)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range got {
		if !ok {
			t.Fatalf("%s absent after the rebuilds", final[i])
		}
	}
	t.Logf("%d probes of added IDs during 3 rebuilds, %d false negatives, %d not-ready answers (failed open); %d IDs at the end",
		probes.Load(), falseNeg.Load(), notReady.Load(), len(final))
	if reader.Config().ExpectedItems != 200_000 {
		t.Fatalf("reader did not follow the resize: %+v", reader.Config())
	}
	if probes.Load() == 0 {
		t.Fatal("no probes ran")
	}
}

func TestRebuildExclusiveAndProgress(t *testing.T) {
	ctx := context.Background()
	_, f := openFilter(t, &bloom.Options{ExpectedItems: 300_000, MaxShardBytes: 64 << 10})
	var last bloom.RebuildProgress
	release := make(chan struct{})
	started := make(chan struct{})
	slow := func(yield func(string, error) bool) {
		close(started)
		<-release
		for i := range 250_000 {
			if !yield(strconv.Itoa(i), nil) {
				return
			}
		}
	}
	done := make(chan error)
	go func() {
		_, err := f.Rebuild(ctx, slow, &bloom.RebuildOptions{ChunkBytes: 16 << 10, Progress: func(p bloom.RebuildProgress) { last = p }})
		done <- err
	}()
	<-started
	if _, err := f.Rebuild(ctx, seq("x", 1), nil); !errors.Is(err, bloom.ErrRebuilding) {
		t.Fatalf("second rebuild: %v, want ErrRebuilding", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if last.IDs != 250_000 || last.BytesUploaded != last.BytesTotal || last.BytesTotal < f.Config().Bits/8 {
		t.Fatalf("last progress %+v", last)
	}
}

// BenchmarkRebuild rebuilds a filter sized for CG_BENCH_IDS IDs (default
// 10,000,000) at 1% from a generated source: the wall time, the time per ID,
// Redis's memory per ID and the process's peak resident memory during the
// rebuild (VmHWM after resetting it). Run it with -benchtime 1x.
func BenchmarkRebuild(b *testing.B) {
	n := 10_000_000
	if s := os.Getenv("CG_BENCH_IDS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	ctx := context.Background()
	c := redistest.Connect(b)
	opts := &bloom.Options{ExpectedItems: uint64(n), FalsePositiveRate: 0.01}
	for b.Loop() {
		f, err := bloom.Open(ctx, c, c.Prefix+":rebuild", opts)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		resetPeakRSS(b)
		start := time.Now()
		if _, err := f.Rebuild(ctx, seq("id-", n), nil); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		peak := peakRSS(b)
		in, err := f.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(took.Seconds(), "rebuild-s")
		b.ReportMetric(float64(took.Nanoseconds())/float64(n), "ns/ID")
		b.ReportMetric(float64(in.MemoryBytes)/float64(n), "redis-B/ID")
		b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
		b.ReportMetric(float64(in.Config.Bits/8)/(1<<20), "filter-MiB")
		c.Del(ctx, c.Prefix+":rebuild:meta")
	}
}

// resetPeakRSS resets the process's VmHWM to its current resident size.
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatalf("reset the peak resident size: %v", err)
	}
}

// peakRSS reads the process's peak resident size (VmHWM) in bytes.
func peakRSS(b *testing.B) uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}
