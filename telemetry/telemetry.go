// Package telemetry owns Sandgate's metrics pipeline: an OpenTelemetry MeterProvider whose
// instruments are exposed in Prometheus format on the admin listener's /metrics.
//
// Components take a metric.MeterProvider and create their own instruments; they never import
// Prometheus. Names follow "sandgate.<area>.<what>" and become sandgate_<area>_<what>[_total].
package telemetry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Telemetry is the process's metrics pipeline.
type Telemetry struct {
	registry *prometheus.Registry
	provider *sdkmetric.MeterProvider
}

// New builds the pipeline with Go runtime and process collectors registered.
func New() (*Telemetry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	return &Telemetry{registry: reg, provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))}, nil
}

// MeterProvider is what components create their instruments from.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.provider }

// Registerer is for the few collectors written against Prometheus directly (client-go's
// controller metrics).
func (t *Telemetry) Registerer() prometheus.Registerer { return t.registry }

// Handler serves /metrics.
func (t *Telemetry) Handler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{ErrorLog: nil})
}

// Shutdown stops the pipeline.
func (t *Telemetry) Shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }
