// Package telemetry owns Sandgate's metrics pipeline: an OpenTelemetry MeterProvider whose
// instruments are exposed in Prometheus format on the admin listener's /metrics, and its
// TracerProvider: spans are exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER=otlp is set (configured by the
// standard OTEL_* variables), and not made at all otherwise (a no-op provider costs nothing).
//
// Components take a metric.MeterProvider and create their own instruments; they never import
// Prometheus. Names follow "sandgate.<area>.<what>" and become sandgate_<area>_<what>[_total].
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Telemetry is the process's metrics and tracing pipeline.
type Telemetry struct {
	registry *prometheus.Registry
	provider *sdkmetric.MeterProvider
	tracer   trace.TracerProvider
	traces   *sdktrace.TracerProvider // nil when spans are not exported
}

// Option configures New.
type Option func(*options)

type options struct {
	getenv   func(string) string
	exporter sdktrace.SpanExporter
}

// WithGetenv replaces os.Getenv for the decision whether to export spans (the OTLP exporter
// itself reads the process environment).
func WithGetenv(f func(string) string) Option { return func(o *options) { o.getenv = f } }

// WithSpanExporter exports spans to e (synchronously, for tests) instead of the environment's
// choice.
func WithSpanExporter(e sdktrace.SpanExporter) Option { return func(o *options) { o.exporter = e } }

// New builds the pipeline with Go runtime and process collectors registered.
func New(opts ...Option) (*Telemetry, error) {
	o := options{getenv: os.Getenv}
	for _, f := range opts {
		f(&o)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	t := &Telemetry{registry: reg, provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), tracer: tracenoop.NewTracerProvider()}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", "sandgate")))
	if err != nil {
		res = resource.Default()
	}
	switch {
	case o.exporter != nil:
		t.traces = sdktrace.NewTracerProvider(sdktrace.WithSyncer(o.exporter), sdktrace.WithResource(res))
	case exportTraces(o.getenv):
		e, err := otlptracehttp.New(context.Background())
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter (OTEL_EXPORTER_OTLP_*): %w", err)
		}
		t.traces = sdktrace.NewTracerProvider(sdktrace.WithBatcher(e), sdktrace.WithResource(res))
	}
	if t.traces != nil {
		t.tracer = t.traces
	}
	return t, nil
}

// exportTraces reports whether the environment asks for spans to be exported over OTLP.
func exportTraces(getenv func(string) string) bool {
	switch getenv("OTEL_TRACES_EXPORTER") {
	case "none":
		return false
	case "otlp":
		return true
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// TracerProvider is what components start their spans from: a no-op one unless spans are
// exported.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tracer }

// Propagator writes the W3C traceparent (and tracestate) of a span into outgoing requests.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }

// MeterProvider is what components create their instruments from.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.provider }

// Registerer is for the few collectors written against Prometheus directly (client-go's
// controller metrics).
func (t *Telemetry) Registerer() prometheus.Registerer { return t.registry }

// Handler serves /metrics.
func (t *Telemetry) Handler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{ErrorLog: nil})
}

// Shutdown stops the pipeline, exporting the spans still buffered.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.traces != nil {
		errs = append(errs, t.traces.Shutdown(ctx))
	}
	errs = append(errs, t.provider.Shutdown(ctx))
	return errors.Join(errs...)
}
