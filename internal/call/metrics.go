package call

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/telemetry"
)

// metrics are the request path's: one set for both halves, labelled by kind, allow and code.
type metrics struct {
	calls       metric.Int64Counter
	duration    metric.Float64Histogram
	tokens      metric.Int64Counter
	auditErrors metric.Int64Counter
	suppressed  metric.Int64Counter
	// reportOnlys counts the denials a report-only template's calls were let through with.
	reportOnlys metric.Int64Counter
	reportAttrs *telemetry.AttrSets[callAttrs]
	attrs       *telemetry.AttrSets[callAttrs]
	codes       *telemetry.LabelSet
	tokensIn    telemetry.Measurement
	tokensOut   telemetry.Measurement
}

type callAttrs struct {
	kind  audit.Kind
	code  string
	allow bool
}

// The code label is a closed set: the refusal table's codes and the request path's own words,
// plus up to maxOtherCodes other codes (a policy's own, the dial guard's reasons) the first time
// each is seen; anything else, such as an error text from mcp-go or an upstream, is "other"
// (the text stays in the event's outcome.error). Every value is a series, and an AttrSets
// entry, for the life of the process.
const maxOtherCodes = 256

// outcomeWords are the codes the request path itself writes that are not refusals.
var outcomeWords = []string{"ok", "deny", "suppressed", CodeClientClosed}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter("github.com/sandgate/sandgate/internal/call")
	x := &metrics{
		codes: telemetry.NewLabelSet(maxOtherCodes, append(slices.Collect(maps.Keys(codes)), outcomeWords...)...),
		attrs: telemetry.NewAttrSets(func(k callAttrs) metric.MeasurementOption {
			return metric.WithAttributes(attribute.String("kind", string(k.kind)), attribute.Bool("allow", k.allow), attribute.String("code", k.code))
		}),
		reportAttrs: telemetry.NewAttrSets(func(k callAttrs) metric.MeasurementOption {
			return metric.WithAttributes(attribute.String("kind", string(k.kind)), attribute.String("code", k.code))
		}),
		tokensIn:  metric.WithAttributes(attribute.String("direction", "in")),
		tokensOut: metric.WithAttributes(attribute.String("direction", "out")),
	}
	var err error
	if x.calls, err = m.Int64Counter("sandgate.calls",
		metric.WithDescription("Sandbox-facing requests (MCP and proxy), each one audit event, by kind, allow and code")); err != nil {
		return nil, fmt.Errorf("call metrics: %w", err)
	}
	if x.duration, err = m.Float64Histogram("sandgate.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a request's arrival to its audit event, by kind, allow and code")); err != nil {
		return nil, fmt.Errorf("call metrics: %w", err)
	}
	if x.tokens, err = m.Int64Counter("sandgate.tokens", metric.WithDescription("Model tokens by direction")); err != nil {
		return nil, fmt.Errorf("call metrics: %w", err)
	}
	if x.auditErrors, err = m.Int64Counter("sandgate.audit.write_errors",
		metric.WithDescription("Audit events of answered requests that could not be recorded")); err != nil {
		return nil, fmt.Errorf("call metrics: %w", err)
	}
	if x.suppressed, err = m.Int64Counter("sandgate.rejections.suppressed",
		metric.WithDescription("Protocol-level rejections whose events were folded into a counted suppressed event")); err != nil {
		return nil, fmt.Errorf("call metrics: %w", err)
	}
	if x.reportOnlys, err = m.Int64Counter("sandgate.policy.report_only",
		metric.WithDescription("Calls a policy denied but did not enforce (report-only template), let through, by kind and the denial's code")); err != nil {
		return nil, fmt.Errorf("call metrics: %w", err)
	}
	return x, nil
}

func (m *metrics) reportOnly(ctx context.Context, kind audit.Kind, code string) {
	m.reportOnlys.Add(ctx, 1, m.reportAttrs.Get(callAttrs{kind: kind, code: m.codes.Value(code)}))
}

func (m *metrics) call(ctx context.Context, ev *audit.Event, code string, elapsed time.Duration) {
	attrs := m.attrs.Get(callAttrs{kind: ev.Kind, code: m.codes.Value(code), allow: ev.Decision.Allow})
	m.calls.Add(ctx, 1, attrs)
	m.duration.Record(ctx, elapsed.Seconds(), attrs)
	if ev.Outcome.TokensIn+ev.Outcome.TokensOut > 0 {
		m.tokens.Add(ctx, ev.Outcome.TokensIn, m.tokensIn)
		m.tokens.Add(ctx, ev.Outcome.TokensOut, m.tokensOut)
	}
}
