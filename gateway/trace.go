package gateway

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/telemetry"
	"github.com/sandgate/sandgate/policy"
)

// startSpan starts the span of one call (tools/call, resources/read, prompts/get). record ends
// up writing the identity, decision and upstream onto it and its trace ID into the audit event.
func (g *Gateway) startSpan(ctx context.Context, method string) (context.Context, trace.Span) {
	return g.tracer.Start(ctx, "mcp "+method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.method", method)))
}

// spanDecision puts the decision's code on the call's span.
func spanDecision(ctx context.Context, d policy.Decision) {
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("sandgate.decision.code", d.Code))
}

// spanEvent puts what the audit event says on the call's span and the span's trace ID into
// the event.
func spanEvent(ctx context.Context, ev *audit.Event) {
	span := trace.SpanFromContext(ctx)
	sc := span.SpanContext()
	if !sc.IsValid() {
		return
	}
	ev.TraceID = sc.TraceID().String()
	span.SetAttributes(
		attribute.String("sandgate.identity.namespace", ev.Identity.Namespace),
		attribute.String("sandgate.identity.sandbox", ev.Identity.Sandbox),
		attribute.String("sandgate.identity.template", ev.Identity.Template),
		attribute.Bool("sandgate.decision.allow", ev.Decision.Allow),
		attribute.String("sandgate.upstream", ev.Target.Upstream),
		attribute.String("sandgate.tool", ev.Target.Tool),
		attribute.Int("sandgate.outcome.status", ev.Outcome.Status),
	)
}

// tracingTransport writes the W3C traceparent of the request's span into every request to an
// HTTP upstream, replacing any the request carried.
type tracingTransport struct{ base http.RoundTripper }

func (t tracingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		r = r.Clone(r.Context())
		telemetry.Propagator().Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	}
	return t.base.RoundTrip(r)
}
