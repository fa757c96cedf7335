package proxy

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/telemetry"
)

type metrics struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	denied   metric.Int64Counter
	tunnels  metric.Int64UpDownCounter
	tokens   metric.Int64Counter
	// upstreamConns counts the connections the pooled upstream transports hold open.
	upstreamConns metric.Int64UpDownCounter

	requestAttrs        *telemetry.AttrSets[requestAttrs]
	tokensIn, tokensOut telemetry.Measurement
}

type requestAttrs struct {
	kind, code string
	allow      bool
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter("github.com/sandgate/sandgate/proxy")
	x := metrics{
		requestAttrs: telemetry.NewAttrSets(func(k requestAttrs) metric.MeasurementOption {
			return metric.WithAttributes(attribute.String("kind", k.kind), attribute.Bool("allow", k.allow), attribute.String("code", k.code))
		}),
		tokensIn:  metric.WithAttributes(attribute.String("direction", "in")),
		tokensOut: metric.WithAttributes(attribute.String("direction", "out")),
	}
	var err error
	if x.requests, err = m.Int64Counter("sandgate.proxy.requests", metric.WithDescription("Decided proxy requests and tunnels by kind, allow and code.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.duration, err = m.Float64Histogram("sandgate.proxy.request.duration", metric.WithUnit("s"), metric.WithDescription("Time from request to last response byte.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.denied, err = m.Int64Counter("sandgate.proxy.dial_denied", metric.WithDescription("Destinations refused by the dial guard, by reason.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.tunnels, err = m.Int64UpDownCounter("sandgate.proxy.tunnels.active", metric.WithDescription("Open CONNECT tunnels.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.tokens, err = m.Int64Counter("sandgate.proxy.tokens", metric.WithDescription("Model tokens by direction.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.upstreamConns, err = m.Int64UpDownCounter("sandgate.proxy.upstream.connections",
		metric.WithDescription("Open connections of the pooled upstream transports, by upstream (route name or host:port).")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	return &x, nil
}

func (m *metrics) dialDenied(r DenyReason) {
	m.denied.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", string(r))))
}
