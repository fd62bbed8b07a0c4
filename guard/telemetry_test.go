package guard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// otelRig is an SDK the way an application would set one up, with an
// in-memory span recorder and a manual metric reader to read back.
type otelRig struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
}

func newOtelRig(t *testing.T) *otelRig {
	r := &otelRig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	r.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		_ = r.tp.Shutdown(context.Background())
		_ = r.mp.Shutdown(context.Background())
	})
	return r
}

// collect reads the metrics. A failed collection fails the test unless
// the filter gauges could not read Redis (down on purpose): the rest is
// still collected then.
func (r *otelRig) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil && !errors.Is(err, guard.ErrUnavailable) {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func attr(set attribute.Set, key string) string {
	v, _ := set.Value(attribute.Key(key))
	return v.Emit()
}

// TestOpenTelemetryReadsBack: a known sequence of Gets, read back from the
// SDK: one span per Get with its outcome, load spans under the Gets that
// loaded, the per-outcome counter, the load histogram, a lock wait from a
// second process, and the filter gauges.
func TestOpenTelemetryReadsBack(t *testing.T) {
	c := redistest.Connect(t)
	ctx := context.Background()
	rig := newOtelRig(t)
	opts := &guard.Options{
		KeyPrefix: c.Prefix,
		Filter:    guard.FilterOptions{ExpectedItems: 1000},
		Telemetry: guard.TelemetryOptions{TracerProvider: rig.tp, MeterProvider: rig.mp},
	}
	g, err := guard.New(ctx, c, "product", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, ids("p", 10), nil); err != nil {
		t.Fatal(err)
	}
	d := newDB(5) // p0..p4 exist; p5..p9 are in the filter but not in the DB
	boom := errors.New("db down")
	failing := func(context.Context, string) (product, error) { return product{}, boom }

	steps := []struct {
		id      string
		load    guard.LoadFunc[product]
		outcome string
	}{
		{"p1", d.load, guard.OutcomeMiss},
		{"p1", d.load, guard.OutcomeHit},
		{"p1", d.load, guard.OutcomeHit},
		{"nope", d.load, guard.OutcomeReject},
		{"p7", d.load, guard.OutcomeMiss}, // the load says not found: a marker is written
		{"p7", d.load, guard.OutcomeMarker},
		{"p2", failing, guard.OutcomeError},
	}
	for _, s := range steps {
		_, _ = guard.Get(ctx, g, s.id, s.load)
	}

	// A second process (another Guard on the same keys) waits while the
	// first loads p3: one lock wait, woken by the first one's publish.
	g2, err := guard.New(ctx, c, "product", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	release := make(chan struct{})
	loading := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := guard.Get(ctx, g, "p3", func(ctx context.Context, id string) (product, error) {
			close(loading)
			<-release
			return d.load(ctx, id)
		})
		first <- err
	}()
	<-loading
	second := make(chan error, 1)
	go func() {
		_, err := guard.Get(ctx, g2, "p3", d.load)
		second <- err
	}()
	eventually(t, 10*time.Second, "the second process waits", func() bool { return g2.Stats().LockWaits > 0 })
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}

	// Spans.
	var gets, loads, waits []sdktrace.ReadOnlySpan
	for _, s := range rig.spans.Ended() {
		switch s.Name() {
		case "cacheguard.Get":
			gets = append(gets, s)
		case "cacheguard.load":
			loads = append(loads, s)
		case "cacheguard.lock.wait":
			waits = append(waits, s)
		}
	}
	if len(gets) != len(steps)+2 {
		t.Fatalf("%d Get spans, want %d", len(gets), len(steps)+2)
	}
	for i, s := range steps {
		set := attribute.NewSet(gets[i].Attributes()...)
		if got := attr(set, "cacheguard.outcome"); got != s.outcome {
			t.Errorf("Get %d (%s): outcome %q, want %q", i, s.id, got, s.outcome)
		}
		if got := attr(set, "cacheguard.guard"); got != "product" {
			t.Errorf("Get %d: guard %q", i, got)
		}
		if failed := gets[i].Status().Code == codes.Error; failed != (s.outcome == guard.OutcomeError) {
			t.Errorf("Get %d (%s): error status %v", i, s.id, failed)
		}
	}
	// Loads: p1, p7, p2 (failed), p3: each under the Get that ran it.
	if len(loads) != 4 {
		t.Fatalf("%d load spans, want 4", len(loads))
	}
	parents := map[string]bool{}
	for _, s := range gets {
		parents[s.SpanContext().SpanID().String()] = true
	}
	for _, s := range loads {
		if !parents[s.Parent().SpanID().String()] || s.Parent().TraceID() != s.SpanContext().TraceID() {
			t.Errorf("load span %v is not under a Get", s.SpanContext().SpanID())
		}
	}
	if len(waits) != 1 || attr(attribute.NewSet(waits[0].Attributes()...), "cacheguard.result") != "woken" {
		t.Fatalf("lock wait spans: %d, want 1 woken", len(waits))
	}

	// Metrics.
	ms := rig.collect(t)
	sum, ok := ms["cacheguard.gets"].Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("cacheguard.gets: %T", ms["cacheguard.gets"].Data)
	}
	got := map[string]int64{}
	for _, p := range sum.DataPoints {
		got[attr(p.Attributes, "cacheguard.outcome")] += p.Value
	}
	// The two p3 Gets: the first loaded it (miss); the second found it
	// after its wait (a hit, from the re-read).
	want := map[string]int64{guard.OutcomeMiss: 3, guard.OutcomeHit: 3, guard.OutcomeReject: 1, guard.OutcomeMarker: 1, guard.OutcomeError: 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("cacheguard.gets{outcome=%s} = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	hist, ok := ms["cacheguard.load.duration"].Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("cacheguard.load.duration: %T", ms["cacheguard.load.duration"].Data)
	}
	results := map[string]uint64{}
	for _, p := range hist.DataPoints {
		results[attr(p.Attributes, "cacheguard.result")] += p.Count
	}
	if results["ok"] != 2 || results["not_found"] != 1 || results["error"] != 1 {
		t.Errorf("load durations by result: %v, want ok 2, not_found 1, error 1", results)
	}
	waitHist, ok := ms["cacheguard.lock.wait.duration"].Data.(metricdata.Histogram[float64])
	if !ok || len(waitHist.DataPoints) != 1 || waitHist.DataPoints[0].Count != 1 {
		t.Errorf("lock wait durations: %+v", ms["cacheguard.lock.wait.duration"].Data)
	}
	info, err := g.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"cacheguard.bloom.fill": info.FillRatio, "cacheguard.bloom.false_positive_rate": info.EstimatedFPRate} {
		gauge, ok := ms[name].Data.(metricdata.Gauge[float64])
		if !ok || len(gauge.DataPoints) == 0 {
			t.Fatalf("%s: %+v", name, ms[name].Data)
		}
		for _, p := range gauge.DataPoints { // one per Guard (both are "product")
			if p.Value != want || p.Value <= 0 {
				t.Errorf("%s = %v, want %v (> 0)", name, p.Value, want)
			}
		}
	}
}

// TestOpenTelemetryOffRecordsNothing: without providers no span is made,
// even when the caller's context carries a recording span.
func TestOpenTelemetryOffRecordsNothing(t *testing.T) {
	c := redistest.Connect(t)
	ctx := context.Background()
	rig := newOtelRig(t)
	g, err := guard.New(ctx, c, "product", &guard.Options{KeyPrefix: c.Prefix, Filter: guard.FilterOptions{ExpectedItems: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Rebuild(ctx, ids("p", 10), nil); err != nil {
		t.Fatal(err)
	}
	ctx, parent := rig.tp.Tracer("app").Start(ctx, "request")
	d := newDB(5)
	for _, id := range []string{"p1", "p1", "nope"} {
		_, _ = guard.Get(ctx, g, id, d.load)
	}
	parent.End()
	if n := len(rig.spans.Ended()); n != 1 {
		t.Fatalf("%d spans ended, want only the application's own", n)
	}
	if a := rig.spans.Ended()[0].Attributes(); len(a) != 0 {
		t.Fatalf("the application's span got attributes: %v", a)
	}
}

// TestOpenTelemetryOtherOutcomes: a local hit, callers that shared a
// flight, and a load-through while Redis is down, each on its span and the
// counter.
func TestOpenTelemetryOtherOutcomes(t *testing.T) {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	ctx := context.Background()
	rig := newOtelRig(t)
	srv, _, g := privateGuard(t, &guard.Options{
		Local:     &guard.LocalOptions{TTL: time.Minute},
		Telemetry: guard.TelemetryOptions{TracerProvider: rig.tp, MeterProvider: rig.mp},
	})
	d := newDB(10)
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil { // miss
		t.Fatal(err)
	}
	if _, err := guard.Get(ctx, g, "p1", d.load); err != nil { // from process memory
		t.Fatal(err)
	}
	// Eight callers of p2 at once while its load is held: those that
	// started before the flight share it (coalesced); any that started
	// after it run the next flight (see join), so the split is counted, not
	// assumed: every Get is a miss (it ran a load) or coalesced.
	release := make(chan struct{})
	loading := make(chan string, 8)
	slow := func(ctx context.Context, id string) (product, error) {
		loading <- id
		<-release
		return d.load(ctx, id)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := guard.Get(ctx, g, "p2", slow)
			errs <- err
		}()
	}
	close(start)
	root := redistest.GoID() // each caller loads (the flight) or joins it
	waitFor(t, func() bool { return len(loading)+joinedFlights(root) == 8 })
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	loadsP2 := int(d.calls.Load()) - 1 // p1 loaded once before
	if loadsP2 < 1 || loadsP2 > 7 {
		t.Fatalf("%d loads for 8 concurrent callers of p2: no flight was shared", loadsP2)
	}
	// Redis down: p3 is loaded through.
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.Get(ctx, g, "p3", d.load); err != nil {
		t.Fatal(err)
	}

	outcomes := map[string]int{}
	for _, s := range rig.spans.Ended() {
		if s.Name() == "cacheguard.Get" {
			outcomes[attr(attribute.NewSet(s.Attributes()...), "cacheguard.outcome")]++
		}
	}
	// p2's eight: loadsP2 misses, the rest coalesced, or hits for a later
	// flight whose re-check found what the first one wrote.
	hitsP2 := 8 - loadsP2 - outcomes[guard.OutcomeCoalesced]
	if outcomes[guard.OutcomeCoalesced] < 1 || outcomes[guard.OutcomeHit] != hitsP2 {
		t.Errorf("p2: %d loads, outcomes %v: the eight Gets are not all accounted for", loadsP2, outcomes)
	}
	want := map[string]int{guard.OutcomeMiss: 1 + loadsP2, guard.OutcomeLocalHit: 1, guard.OutcomeCoalesced: outcomes[guard.OutcomeCoalesced],
		guard.OutcomeHit: hitsP2, guard.OutcomeLoadThrough: 1}
	for k, v := range want {
		if outcomes[k] != v {
			t.Errorf("spans with outcome %s: %d, want %d (all: %v)", k, outcomes[k], v, outcomes)
		}
	}
	sum := rig.collect(t)["cacheguard.gets"].Data.(metricdata.Sum[int64])
	got := map[string]int64{}
	for _, p := range sum.DataPoints {
		got[attr(p.Attributes, "cacheguard.outcome")] += p.Value
	}
	for k, v := range want {
		if got[k] != int64(v) {
			t.Errorf("cacheguard.gets{outcome=%s} = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}
