package policy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/telemetry"
)

// maxPolicyCodes bounds the distinct codes the decision metrics label by: a policy chooses its
// codes (and could build one from its input), and each value is a series for the life of the
// process. Past the bound, and for a code not shaped like one, the label is "other".
const maxPolicyCodes = 256

// newCodeLabels is the code label of the policy metrics: the engine's own codes and up to
// maxPolicyCodes of a policy's.
func newCodeLabels() *telemetry.LabelSet {
	return telemetry.NewLabelSet(maxPolicyCodes, CodeNoPolicy, CodeEvalError, CodeUndefined, CodeBadResult,
		CodeInputError, CodePolicyAllow, CodePolicyDeny)
}

// WithMeterProvider records decisions (by kind, allow and code), evaluation time, reload results
// and failures (by reason), whether hot reload is degraded, and the age of the serving revision.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(e *Engine) {
		m := mp.Meter("github.com/sandgate/sandgate/policy")
		e.metrics = &engineMetrics{codes: newCodeLabels()}
		// Counted in an atomic per series and read at collection, like the cache lookups below:
		// the SDK counter's Add normalised and looked up the attribute set on every decision,
		// beside the histogram's Record that must stay.
		decisions, _ := m.Int64ObservableCounter("sandgate.policy.decisions",
			metric.WithDescription("Policy decisions by kind, allow and reason code."))
		_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			e.metrics.series.Range(func(_, v any) bool {
				// A series is stored just before its first count: skip it until then, as a
				// counter shows no series before its first Add.
				s := v.(*decisionSeries)
				if n := s.count.Load(); n > 0 {
					o.ObserveInt64(decisions, n, s.attrs)
				}
				return true
			})
			return nil
		}, decisions)
		e.metrics.evalTime, _ = m.Float64Histogram("sandgate.policy.evaluation.duration",
			metric.WithUnit("s"), metric.WithDescription("Time to evaluate one decision."),
			metric.WithExplicitBucketBoundaries(5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2))
		// Counted in two atomics and read at collection: an SDK counter's Add resolves its
		// attribute set on every call, 1.6% of an MCP tools/call's CPU for the two lookups
		// (the visibility and the call decision), against nothing here.
		cache, _ := m.Int64ObservableCounter("sandgate.policy.decision_cache.lookups",
			metric.WithDescription("Decision cache lookups by result (hit, miss); none when the revision is uncacheable."))
		hit := metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "hit")))
		miss := metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "miss")))
		_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(cache, e.metrics.cacheHits.Load(), hit)
			o.ObserveInt64(cache, e.metrics.cacheMisses.Load(), miss)
			return nil
		}, cache)
		e.metrics.reloads, _ = m.Int64Counter("sandgate.policy.reloads",
			metric.WithDescription("Policy reload attempts by result (ok, unchanged, rejected)."))
		e.metrics.failures, _ = m.Int64Counter("sandgate.policy.reload.failures",
			metric.WithDescription("Policy reload failures by reason (read, compile, no_policy, watch); the last good revision keeps serving."))
		revision, _ := m.Int64ObservableGauge("sandgate.policy.revision.info",
			metric.WithDescription("1 for the policy revision serving now."))
		age, _ := m.Float64ObservableGauge("sandgate.policy.revision.age",
			metric.WithUnit("s"), metric.WithDescription("Seconds since the serving policy revision was loaded."))
		lastSuccess, _ := m.Float64ObservableGauge("sandgate.policy.reload.last_success",
			metric.WithUnit("s"), metric.WithDescription("Unix time of the last policy reload attempt that succeeded, changed or not."))
		degraded, _ := m.Int64ObservableGauge("sandgate.policy.reload.degraded",
			metric.WithDescription("1 while the last policy reload or the folder watch failed (the last good revision serves)."))
		_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			s := e.Status()
			o.ObserveInt64(revision, 1, metric.WithAttributes(attribute.String("revision", s.Revision)))
			if !s.LoadedAt.IsZero() {
				o.ObserveFloat64(age, e.clock.Now().Sub(s.LoadedAt).Seconds())
			}
			if !s.LastSuccess.IsZero() {
				o.ObserveFloat64(lastSuccess, float64(s.LastSuccess.UnixNano())/1e9)
			}
			var d int64
			if s.Degraded() {
				d = 1
			}
			o.ObserveInt64(degraded, d)
			return nil
		}, revision, age, lastSuccess, degraded)
	}
}

type engineMetrics struct {
	evalTime metric.Float64Histogram
	reloads  metric.Int64Counter
	failures metric.Int64Counter
	// Decision cache lookups, by result.
	cacheHits, cacheMisses atomic.Int64
	// series holds the decisions by kind, code and allow (attrKey → *decisionSeries); small and
	// bounded, as the kinds and the code labels are.
	series sync.Map
	codes  *telemetry.LabelSet
}

type attrKey struct {
	kind, code string
	allow      bool
}

// decisionSeries is one (kind, allow, code): its decision count and its attributes, built once,
// with the option list the histogram's Record takes (passed as a slice, not one per call).
type decisionSeries struct {
	count  atomic.Int64
	attrs  metric.MeasurementOption
	record []metric.RecordOption
}

func (m *engineMetrics) seriesOf(k attrKey) *decisionSeries {
	if s, ok := m.series.Load(k); ok {
		return s.(*decisionSeries)
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("kind", k.kind), attribute.Bool("allow", k.allow), attribute.String("code", k.code)))
	s, _ := m.series.LoadOrStore(k, &decisionSeries{attrs: attrs, record: []metric.RecordOption{attrs}})
	return s.(*decisionSeries)
}

func (m *engineMetrics) record(ctx context.Context, kind string, d *Decision, start time.Time) {
	if m == nil {
		return
	}
	s := m.seriesOf(attrKey{kind, m.codes.Value(d.Code), d.Allow})
	s.count.Add(1)
	m.evalTime.Record(ctx, time.Since(start).Seconds(), s.record...)
}

func (m *engineMetrics) cacheLookup(hit bool) {
	switch {
	case m == nil:
	case hit:
		m.cacheHits.Add(1)
	default:
		m.cacheMisses.Add(1)
	}
}

func (m *engineMetrics) reloaded(r ReloadResult) {
	if m == nil {
		return
	}
	result := "unchanged"
	switch {
	case r.Err != nil:
		result = "rejected"
	case r.Changed:
		result = "ok"
	}
	m.reloads.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", result)))
	if r.Err != nil {
		m.reloadFailed(r.Reason)
	}
}

func (m *engineMetrics) reloadFailed(reason string) {
	if m == nil {
		return
	}
	m.failures.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", reason)))
}
