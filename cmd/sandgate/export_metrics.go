package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/audit"
)

// observeFollower exports a follower of the audit file (destination "otlp" or "redis_stream"):
// lines exported, failed and rejected, and how far behind the file it is, in bytes and in the age of the
// oldest line not yet sent. A lag that grows means the destination is away or too slow; the
// file still has every event.
func observeFollower(mp metric.MeterProvider, destination string, f *audit.Follower) error {
	m := mp.Meter("github.com/sandgate/sandgate/audit")
	records, err := m.Int64ObservableCounter("sandgate.audit.export.records",
		metric.WithDescription("Audit log lines sent to a destination (result: exported; failed for each attempt that failed; rejected when the destination refused them for good)"))
	if err != nil {
		return fmt.Errorf("audit export metrics: %w", err)
	}
	lagSeconds, err := m.Float64ObservableGauge("sandgate.audit.export.lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest audit event not yet sent to the destination; 0 when caught up"))
	if err != nil {
		return fmt.Errorf("audit export metrics: %w", err)
	}
	lagBytes, err := m.Int64ObservableGauge("sandgate.audit.export.lag_bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes of the audit log not yet sent to the destination"))
	if err != nil {
		return fmt.Errorf("audit export metrics: %w", err)
	}
	dest := attribute.String("destination", destination)
	exported := metric.WithAttributes(dest, attribute.String("result", "exported"))
	failed := metric.WithAttributes(dest, attribute.String("result", "failed"))
	rejected := metric.WithAttributes(dest, attribute.String("result", "rejected"))
	only := metric.WithAttributes(dest)
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := f.Stats()
		o.ObserveInt64(records, int64(s.Sent), exported)
		o.ObserveInt64(records, int64(s.Failed), failed)
		o.ObserveInt64(records, int64(s.Rejected), rejected)
		lag := 0.0
		if !s.Oldest.IsZero() {
			lag = max(0, time.Since(s.Oldest).Seconds())
		}
		o.ObserveFloat64(lagSeconds, lag, only)
		o.ObserveInt64(lagBytes, s.BehindBytes, only)
		return nil
	}, records, lagSeconds, lagBytes)
	if err != nil {
		return fmt.Errorf("audit export metrics: %w", err)
	}
	return nil
}
