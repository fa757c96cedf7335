package gateway

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/telemetry"
)

type metrics struct {
	calls       metric.Int64Counter
	duration    metric.Float64Histogram
	auditErrors metric.Int64Counter
	attrs       *telemetry.AttrSets[[2]string] // kind, outcome
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter("github.com/sandgate/sandgate/gateway")
	calls, err := m.Int64Counter("sandgate.gateway.calls",
		metric.WithDescription("MCP calls by kind and outcome (allowed, denied, failed)"))
	if err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	auditErrors, err := m.Int64Counter("sandgate.gateway.audit_errors",
		metric.WithDescription("Audit events that could not be recorded"))
	if err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	duration, err := m.Float64Histogram("sandgate.gateway.call.duration", metric.WithUnit("s"),
		metric.WithDescription("MCP call latency, decision and upstream included, by kind and outcome"))
	if err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	attrs := telemetry.NewAttrSets(func(k [2]string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("kind", k[0]), attribute.String("outcome", k[1]))
	})
	return &metrics{calls: calls, duration: duration, auditErrors: auditErrors, attrs: attrs}, nil
}

// record is the one place the gateway writes audit: exactly one event per call. A Record error
// after the call already happened cannot undo it: it is logged and counted, and the next calls
// are refused while the recorder reports unhealthy.
func (g *Gateway) record(ctx context.Context, ev *audit.Event, start time.Time) {
	ev.Time = start.UTC()
	ev.Identity = identityFrom(ctx)
	elapsed := time.Since(start)
	ev.Outcome.DurationMS = float64(elapsed.Microseconds()) / 1000
	spanEvent(ctx, ev)
	outcome := "allowed"
	switch {
	case !ev.Decision.Allow:
		outcome = "denied"
	case ev.Outcome.Status >= 500:
		outcome = "failed"
	}
	attrs := g.metrics.attrs.Get([2]string{ev.Kind, outcome})
	g.metrics.calls.Add(ctx, 1, attrs)
	g.metrics.duration.Record(ctx, elapsed.Seconds(), attrs)
	if err := g.opts.Audit.Record(ev); err != nil {
		g.metrics.auditErrors.Add(ctx, 1)
		g.log.Error("audit event not recorded", "kind", ev.Kind, "upstream", ev.Target.Upstream, "tool", ev.Target.Tool,
			"allow", ev.Decision.Allow, "err", err)
	}
}
