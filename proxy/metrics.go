package proxy

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics are the proxy's own; requests, durations and tokens are counted by the request path
// (internal/call) for both halves.
type metrics struct {
	denied  metric.Int64Counter
	tunnels metric.Int64UpDownCounter
	// upstreamConns counts the connections the pooled upstream transports hold open.
	upstreamConns metric.Int64UpDownCounter
	echoes        metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter("github.com/sandgate/sandgate/proxy")
	var x metrics
	var err error
	if x.denied, err = m.Int64Counter("sandgate.proxy.dial_denied", metric.WithDescription("Destinations refused by the dial guard, by reason.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.tunnels, err = m.Int64UpDownCounter("sandgate.proxy.tunnels.active", metric.WithDescription("Open CONNECT tunnels.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.upstreamConns, err = m.Int64UpDownCounter("sandgate.proxy.upstream.connections",
		metric.WithDescription("Open connections of the pooled upstream transports, by upstream (route name or host:port).")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	if x.echoes, err = m.Int64Counter("sandgate.proxy.credential_echoes",
		metric.WithDescription("Responses from which a credential value the upstream sent back was removed, by route and host.")); err != nil {
		return nil, fmt.Errorf("create proxy metrics: %w", err)
	}
	return &x, nil
}

func (m *metrics) credentialEcho(route, host string) {
	m.echoes.Add(context.Background(), 1, metric.WithAttributes(attribute.String("route", route), attribute.String("host", host)))
}

func (m *metrics) dialDenied(r DenyReason) {
	m.denied.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", string(r))))
}
