package policy

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// WithMeterProvider records decisions (by kind, allow and code), evaluation time and reload
// results.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(e *Engine) {
		m := mp.Meter("github.com/sandgate/sandgate/policy")
		e.metrics = &engineMetrics{}
		e.metrics.decisions, _ = m.Int64Counter("sandgate.policy.decisions",
			metric.WithDescription("Policy decisions by kind, allow and reason code."))
		e.metrics.evalTime, _ = m.Float64Histogram("sandgate.policy.evaluation.duration",
			metric.WithUnit("s"), metric.WithDescription("Time to evaluate one decision."),
			metric.WithExplicitBucketBoundaries(5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2))
		e.metrics.cache, _ = m.Int64Counter("sandgate.policy.decision_cache.lookups",
			metric.WithDescription("Decision cache lookups by result (hit, miss); none when the revision is uncacheable."))
		e.metrics.cacheHit = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "hit")))
		e.metrics.cacheMiss = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "miss")))
		e.metrics.reloads, _ = m.Int64Counter("sandgate.policy.reloads",
			metric.WithDescription("Policy reload attempts by result (ok, unchanged, rejected)."))
		revision, _ := m.Int64ObservableGauge("sandgate.policy.revision.info",
			metric.WithDescription("1 for the policy revision serving now."))
		_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(revision, 1, metric.WithAttributes(attribute.String("revision", e.Revision())))
			return nil
		}, revision)
		prev := e.onReload
		e.onReload = func(r ReloadResult) {
			result := "unchanged"
			switch {
			case r.Err != nil:
				result = "rejected"
			case r.Changed:
				result = "ok"
			}
			e.metrics.reloads.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", result)))
			if prev != nil {
				prev(r)
			}
		}
	}
}

type engineMetrics struct {
	decisions metric.Int64Counter
	evalTime  metric.Float64Histogram
	reloads   metric.Int64Counter
	cache     metric.Int64Counter
	cacheHit  metric.MeasurementOption
	cacheMiss metric.MeasurementOption
	// attrs caches one attribute set per (kind, allow, code): decisions come from a small,
	// bounded set of combinations, and building a set per call would allocate.
	attrs sync.Map // attrKey → metric.MeasurementOption
}

type attrKey struct {
	kind, code string
	allow      bool
}

func (m *engineMetrics) record(ctx context.Context, kind string, d *Decision, start time.Time) {
	if m == nil {
		return
	}
	k := attrKey{kind, d.Code, d.Allow}
	opt, ok := m.attrs.Load(k)
	if !ok {
		opt, _ = m.attrs.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(
			attribute.String("kind", kind), attribute.Bool("allow", d.Allow), attribute.String("code", d.Code))))
	}
	o := opt.(metric.MeasurementOption)
	m.decisions.Add(ctx, 1, o.(metric.AddOption))
	m.evalTime.Record(ctx, time.Since(start).Seconds(), o.(metric.RecordOption))
}

func (m *engineMetrics) cacheLookup(ctx context.Context, hit bool) {
	if m == nil {
		return
	}
	o := m.cacheMiss
	if hit {
		o = m.cacheHit
	}
	m.cache.Add(ctx, 1, o.(metric.AddOption))
}
