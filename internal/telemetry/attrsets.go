package telemetry

import (
	"sync"

	"go.opentelemetry.io/otel/metric"
)

// Measurement is an option for both Add and Record.
type Measurement interface {
	metric.AddOption
	metric.RecordOption
}

// AttrSets caches one measurement option per key. The attributes of Sandgate's metrics come
// from small, bounded sets (kind × allow × code), and metric.WithAttributes builds and sorts a
// new set on every call: a few allocations on every request for the same handful of values.
type AttrSets[K comparable] struct {
	m     sync.Map // K → Measurement
	build func(K) metric.MeasurementOption
}

// NewAttrSets caches what build returns for each key (metric.WithAttributes(…) or
// metric.WithAttributeSet(…)).
func NewAttrSets[K comparable](build func(K) metric.MeasurementOption) *AttrSets[K] {
	return &AttrSets[K]{build: build}
}

// Get returns the option for k, building it the first time.
func (c *AttrSets[K]) Get(k K) Measurement {
	if v, ok := c.m.Load(k); ok {
		return v.(Measurement)
	}
	v, _ := c.m.LoadOrStore(k, c.build(k).(Measurement))
	return v.(Measurement)
}
