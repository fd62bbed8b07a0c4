package guard

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// OpenTelemetry, API only: the application brings the SDK and passes its
// providers in Options.Telemetry; without them a Guard records nothing and
// a Get pays one nil check. docs/operations.md lists the spans and metrics.

const instrumentation = "github.com/cacheguard/cacheguard/guard"

// Outcome attribute values, one per Get.
const (
	OutcomeHit         = "hit"
	OutcomeLocalHit    = "local_hit"
	OutcomeReject      = "reject"
	OutcomeMarker      = "marker"
	OutcomeMiss        = "miss"
	OutcomeCoalesced   = "coalesced"
	OutcomeLoadThrough = "load_through"
	OutcomeError       = "error"
)

var outcomeNames = [...]string{OutcomeHit, OutcomeLocalHit, OutcomeReject, OutcomeMarker, OutcomeMiss,
	OutcomeCoalesced, OutcomeLoadThrough, OutcomeError}

// getOutcome indexes outcomeNames.
type getOutcome uint8

const (
	getHit getOutcome = iota
	getLocalHit
	getReject
	getMarker
	getMiss
	getCoalesced
	getLoadThrough
	getError
)

// telemetry is a Guard's OpenTelemetry instruments, made once by New; a
// nil *telemetry (no provider) records nothing. Its fields are read-only
// after New.
type telemetry struct {
	tracer trace.Tracer // nil: no spans

	// nil gets: no metrics.
	gets     metric.Int64Counter
	loadDur  metric.Float64Histogram
	waitDur  metric.Float64Histogram
	byOut    [len(outcomeNames)]metric.AddOption // the guard and one outcome, built once
	byResult map[string]metric.RecordOption      // the guard and one load or wait result, built once
	gauges   metric.Registration                 // the filter's gauges; unregistered by Close
	guardKV  attribute.KeyValue
	spanOpts []trace.SpanStartOption
}

func newTelemetry(g *Guard, tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	if tp == nil && mp == nil {
		return nil, nil
	}
	t := &telemetry{guardKV: attribute.String("cacheguard.guard", g.name)}
	t.spanOpts = []trace.SpanStartOption{trace.WithAttributes(t.guardKV), trace.WithSpanKind(trace.SpanKindInternal)}
	if tp != nil {
		t.tracer = tp.Tracer(instrumentation)
	}
	if mp == nil {
		return t, nil
	}
	m := mp.Meter(instrumentation)
	var fill, fp metric.Float64ObservableGauge
	var errs [5]error // New fails with any of them
	t.gets, errs[0] = m.Int64Counter("cacheguard.gets", metric.WithDescription("Get calls (and GetMany IDs) by outcome"),
		metric.WithUnit("{get}"))
	t.loadDur, errs[1] = m.Float64Histogram("cacheguard.load.duration", metric.WithDescription("calls of the load function"),
		metric.WithUnit("s"))
	t.waitDur, errs[2] = m.Float64Histogram("cacheguard.lock.wait.duration",
		metric.WithDescription("waits on another process's load"), metric.WithUnit("s"))
	fill, errs[3] = m.Float64ObservableGauge("cacheguard.bloom.fill",
		metric.WithDescription("share of the bloom filter's bits set"), metric.WithUnit("1"))
	fp, errs[4] = m.Float64ObservableGauge("cacheguard.bloom.false_positive_rate",
		metric.WithDescription("the bloom filter's estimated false-positive rate at its fill"), metric.WithUnit("1"))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	for i, name := range outcomeNames {
		t.byOut[i] = metric.WithAttributeSet(attribute.NewSet(t.guardKV, attribute.String("cacheguard.outcome", name)))
	}
	t.byResult = map[string]metric.RecordOption{}
	for _, name := range []string{"ok", "not_found", "error", "woken", "expired", "timeout", "cancelled"} {
		t.byResult[name] = metric.WithAttributeSet(attribute.NewSet(t.guardKV, attribute.String("cacheguard.result", name)))
	}
	only := metric.WithAttributeSet(attribute.NewSet(t.guardKV))
	var err error
	t.gauges, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, g.opts.Tuning.RedisTimeout)
		defer cancel()
		in, err := g.Info(ctx)
		if err != nil {
			return err // the SDK reports it; the next collection tries again
		}
		o.ObserveFloat64(fill, in.FillRatio, only)
		o.ObserveFloat64(fp, in.EstimatedFPRate, only)
		return nil
	}, fill, fp)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// close unregisters the gauges' callback.
func (t *telemetry) close() error {
	if t == nil || t.gauges == nil {
		return nil
	}
	return t.gauges.Unregister()
}

// start starts a span named name under ctx, or returns ctx and nil.
func (t *telemetry) start(ctx context.Context, name string) (context.Context, trace.Span) {
	if t == nil || t.tracer == nil {
		return ctx, nil
	}
	return t.tracer.Start(ctx, name, t.spanOpts...)
}

// end ends a Get's span: error status for a failure (ErrNotFound is an
// answer, not a failure), and counts a failed Get (answers are counted where
// they are settled: see settled).
func (t *telemetry) end(ctx context.Context, span trace.Span, err error) {
	failed := err != nil && !errors.Is(err, ErrNotFound)
	if failed && t.gets != nil {
		t.gets.Add(ctx, 1, t.byOut[getError])
	}
	if span == nil {
		return
	}
	if failed {
		span.SetAttributes(attribute.String("cacheguard.outcome", OutcomeError))
		span.RecordError(err)
		span.SetStatus(codes.Error, "cacheguard: get failed")
	}
	span.End()
}

// settled records how one Get was answered (see getOutcomeOf): on the
// counter and on the Get's span, its failure left to end. For one ID of a
// GetMany (many), the GetMany's span gets no per-ID outcome, and a failure
// is counted here.
func (t *telemetry) settled(ctx context.Context, o outcome, coalesced, through, many bool) {
	if t == nil || o == outFailed && !many {
		return
	}
	g := getOutcomeOf(o, coalesced, through)
	if t.gets != nil {
		t.gets.Add(ctx, 1, t.byOut[g])
	}
	if t.tracer != nil && !many {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("cacheguard.outcome", outcomeNames[g]))
	}
}

// getOutcomeOf maps an outcome to how a caller was answered (coalesced:
// from another caller's flight; through: without Redis).
func getOutcomeOf(o outcome, coalesced, through bool) getOutcome {
	switch {
	case o == outFailed:
		return getError
	case o == outLocalHit:
		return getLocalHit
	case through: // the answer came without Redis: that matters more than who loaded it
		return getLoadThrough
	case coalesced:
		return getCoalesced
	case o == outHit:
		return getHit
	case o == outEmpty:
		return getMarker
	case o == outRejected:
		return getReject
	}
	return getMiss
}

// endMany ends a GetMany's span with how many IDs it asked and found.
func (t *telemetry) endMany(span trace.Span, asked, found int, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("cacheguard.ids", asked), attribute.Int("cacheguard.found", found))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "cacheguard: get many failed")
	}
	span.End()
}

// load wraps one call of the load function: a span and the duration.
func (t *telemetry) load(ctx context.Context) (context.Context, func(err error)) {
	if t == nil {
		return ctx, func(error) {}
	}
	start := time.Now()
	ctx, span := t.start(ctx, "cacheguard.load")
	return ctx, func(err error) {
		result := "ok"
		switch {
		case errors.Is(err, ErrNotFound):
			result = "not_found"
		case err != nil:
			result = "error"
		}
		if t.loadDur != nil {
			t.loadDur.Record(ctx, time.Since(start).Seconds(), t.resultAttrs(result))
		}
		if span != nil {
			span.SetAttributes(attribute.String("cacheguard.result", result))
			if result == "error" {
				span.RecordError(err)
				span.SetStatus(codes.Error, "cacheguard: load failed")
			}
			span.End()
		}
	}
}

// resultAttrs is the attribute set of a load or wait result (built once in
// newTelemetry for the known results).
func (t *telemetry) resultAttrs(result string) metric.RecordOption {
	if o, ok := t.byResult[result]; ok {
		return o
	}
	return metric.WithAttributes(t.guardKV, attribute.String("cacheguard.result", result))
}

// waited records one wait on another process's load, after the fact.
func (t *telemetry) waited(ctx context.Context, start, end time.Time, result string) {
	if t == nil {
		return
	}
	if t.waitDur != nil {
		t.waitDur.Record(ctx, end.Sub(start).Seconds(), t.resultAttrs(result))
	}
	if t.tracer != nil {
		_, span := t.tracer.Start(ctx, "cacheguard.lock.wait", append(t.spanOpts, trace.WithTimestamp(start))...)
		span.SetAttributes(attribute.String("cacheguard.result", result))
		span.End(trace.WithTimestamp(end))
	}
}
