package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// observeReadiness exports each readiness check as sandgate_readiness_failing{check, effect}: 1
// while it fails, else 0. effect is "not_ready" for the checks that fail /readyz and "degraded"
// for those it only reports (Redis, the audit stream mirror, gateway upstreams, a stale policy),
// so the alerts and the dashboard see what /readyz sees. The checks run at each scrape; each is
// bounded by its own timeout.
func observeReadiness(mp metric.MeterProvider, r *readiness) error {
	m := mp.Meter("github.com/sandgate/sandgate/cmd/sandgate")
	g, err := m.Int64ObservableGauge("sandgate.readiness.failing",
		metric.WithDescription("1 while the readiness check fails (effect: not_ready or degraded), else 0"))
	if err != nil {
		return fmt.Errorf("readiness metrics: %w", err)
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		r.mu.Lock()
		sets := [][]namedCheck{append([]namedCheck(nil), r.checks...), append([]namedCheck(nil), r.degraded...)}
		r.mu.Unlock()
		for i, checks := range sets {
			effect := []string{"not_ready", "degraded"}[i]
			for _, c := range checks {
				v := int64(0)
				if c.check() != nil {
					v = 1
				}
				o.ObserveInt64(g, v, metric.WithAttributes(attribute.String("check", c.name), attribute.String("effect", effect)))
			}
		}
		return nil
	}, g)
	if err != nil {
		return fmt.Errorf("readiness metrics: %w", err)
	}
	return nil
}
