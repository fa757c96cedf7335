package audit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc/credentials"
)

// OTLPCursorFile, in the audit folder, records how far the log has been exported over OTLP.
const OTLPCursorFile = "otlp.cursor"

// OTLPLinger is the exporter's default FollowerConfig.Linger: the OpenTelemetry SDK's batch
// processor exports every second too (OTEL_BLRP_SCHEDULE_DELAY), so a log pipeline already
// expects that delay, and at a few thousand events a second it fills whole batches.
const OTLPLinger = time.Second

// otlpCursorTag marks the OTLP exporter's cursor. It is not the endpoint: pointing the exporter
// at a new Collector continues where it was instead of sending the whole log again.
const otlpCursorTag = "otlp"

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL's values that Sandgate supports).
const (
	OTLPProtocolGRPC = "grpc"
	OTLPProtocolHTTP = "http/protobuf"
)

// OTLPConfig configures an OTLPExporter. Fields left empty are taken from the standard
// OTEL_EXPORTER_OTLP_* (and OTEL_EXPORTER_OTLP_LOGS_*) variables by the OpenTelemetry exporter
// itself; a field set here wins over the variable.
type OTLPConfig struct {
	// Dir is the audit folder the FileSink writes.
	Dir string
	// Protocol is OTLPProtocolGRPC or OTLPProtocolHTTP (default).
	Protocol string
	// Endpoint is the Collector's URL (http://host:port or https://host:port, with a path for
	// OTLP/HTTP when it is not /v1/logs); empty: the environment's, else localhost.
	Endpoint string
	// Insecure sends in plain text (an http:// endpoint); the caller decides when that is safe.
	Insecure bool
	// Headers are sent with every export; their values are not secret.
	Headers map[string]string
	// Auth, when set, gives an auth header for each export (a credential's current value).
	Auth AuthHeader
	// TLS is the client's TLS configuration (trusted roots, client certificate), nil for the
	// system's roots.
	TLS *tls.Config
	// Timeout bounds one export (default 10s).
	Timeout time.Duration
	// Resource describes this process (service.name, service.instance.id …).
	Resource *resource.Resource
	// Follower tunes the follower (Batch, Poll, RetryBackoff, Linger: default OTLPLinger, none
	// when negative); its Dir, Name and cursor are set here.
	Follower FollowerConfig
}

// OTLPExporter ships the audit log as OpenTelemetry log records over OTLP: one LogRecord per
// line, in log order, at least once. It is a Follower of the file (see there): an unreachable
// Collector never holds up a call, memory stays at one batch, and after an outage or a restart
// the exporter continues from its cursor (OTLPCursorFile). A batch is acknowledged by the
// Collector's OTLP response before the cursor moves; one whose answer was lost is sent again, so
// a consumer sees a line at least once and drops repeats by sandgate.event.id.
//
// The exporter uses the OpenTelemetry log SDK's records (resource, scope, limits) and calls the
// OTLP exporter itself, synchronously, instead of the SDK's batch processor: that processor
// drops records when its queue is full and never reports a failed export, and the file already
// is the queue. Each record starts as a copy of one the provider's Logger built (see
// prototypeRecord), so it carries what Emit would give it without Emit's copies.
type OTLPExporter struct {
	*Follower
	exporter  sdklog.Exporter
	provider  *sdklog.LoggerProvider
	prototype sdklog.Record
	timeout   time.Duration
	// records, attrs and the line decoder are reused from batch to batch (Send is never
	// concurrent: the Follower serialises it); the exporter keeps no record after Export.
	records []sdklog.Record
	attrs   []attribute.KeyValue
	lines   lineDecoder
}

// NewOTLPExporter builds an exporter of cfg.Dir's log. Start it with Run; Shutdown releases the
// connection. Nothing is dialled here: an unreachable Collector shows in Healthy, not as an
// error.
func NewOTLPExporter(cfg OTLPConfig) (*OTLPExporter, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	exp, err := newOTLPLogExporter(cfg)
	if err != nil {
		return nil, err
	}
	provider, prototype := newRecordProvider(cfg.Resource)
	e := &OTLPExporter{exporter: exp, provider: provider, prototype: prototype, timeout: cfg.Timeout}
	fc := cfg.Follower
	if fc.Linger == 0 {
		fc.Linger = OTLPLinger
	}
	fc.Dir, fc.Name, fc.CursorFile, fc.CursorTag = cfg.Dir, "audit otlp exporter", OTLPCursorFile, otlpCursorTag
	if e.Follower, err = NewFollower(fc, e); err != nil {
		return nil, errors.Join(err, exp.Shutdown(context.Background()))
	}
	return e, nil
}

func newOTLPLogExporter(cfg OTLPConfig) (sdklog.Exporter, error) {
	ctx := context.Background()
	switch cfg.Protocol {
	case OTLPProtocolHTTP, "":
		// Retries are the follower's (with the file as the queue): the exporter's own would
		// hold a batch for up to a minute in memory and report nothing meanwhile.
		opts := []otlploghttp.Option{otlploghttp.WithTimeout(cfg.Timeout), otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false})}
		if cfg.Endpoint != "" {
			opts = append(opts, otlploghttp.WithEndpointURL(logsURL(cfg.Endpoint)))
		}
		if cfg.Insecure {
			opts = append(opts, otlploghttp.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlploghttp.WithHeaders(cfg.Headers))
		}
		if cfg.TLS != nil {
			opts = append(opts, otlploghttp.WithTLSClientConfig(cfg.TLS))
		}
		if cfg.Auth != nil {
			opts = append(opts, httpAuth(cfg))
		}
		e, err := otlploghttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("audit otlp exporter (http/protobuf): %w", err)
		}
		return e, nil
	case OTLPProtocolGRPC:
		opts := []otlploggrpc.Option{otlploggrpc.WithTimeout(cfg.Timeout), otlploggrpc.WithRetry(otlploggrpc.RetryConfig{Enabled: false})}
		if cfg.Endpoint != "" {
			opts = append(opts, otlploggrpc.WithEndpointURL(cfg.Endpoint))
		}
		if cfg.Insecure {
			opts = append(opts, otlploggrpc.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlploggrpc.WithHeaders(cfg.Headers))
		}
		if cfg.TLS != nil {
			opts = append(opts, otlploggrpc.WithTLSCredentials(credentials.NewTLS(cfg.TLS)))
		}
		if cfg.Auth != nil {
			opts = append(opts, grpcAuth(cfg))
		}
		e, err := otlploggrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("audit otlp exporter (grpc): %w", err)
		}
		return e, nil
	}
	return nil, fmt.Errorf("audit otlp exporter: protocol %q is not %s or %s", cfg.Protocol, OTLPProtocolGRPC, OTLPProtocolHTTP)
}

// logsURL gives an OTLP/HTTP URL without a path the logs path, /v1/logs, as
// OTEL_EXPORTER_OTLP_ENDPOINT does: the exporter takes a URL it is given as it is.
func logsURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return endpoint
	}
	u.Path = "/v1/logs"
	return u.String()
}

// Send exports lines as one OTLP request (the exporter's Destination). It returns nil only when
// the Collector acknowledged the request.
func (e *OTLPExporter) Send(ctx context.Context, lines [][]byte) error {
	now := time.Now()
	clear(e.records) // drop the last batch's bodies and attributes before building this one
	e.records = e.records[:0]
	for _, line := range lines {
		e.records = append(e.records, e.prototype)
		e.attrs = fillRecord(&e.records[len(e.records)-1], &e.lines, line, now, e.attrs)
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	if err := e.exporter.Export(ctx, e.records); err != nil {
		return fmt.Errorf("audit otlp exporter: export %d records: %w", len(lines), err)
	}
	return nil
}

// Shutdown closes the exporter's connection. Call it after the last Sync.
func (e *OTLPExporter) Shutdown(ctx context.Context) error {
	return errors.Join(e.provider.Shutdown(ctx), e.exporter.Shutdown(ctx))
}

// newRecordProvider returns the exporter's LoggerProvider (of res, nil for the default) and a
// record as its Logger builds it, with the provider's resource, scope, limits and key handling:
// the prototype of every record the exporter sends.
func newRecordProvider(res *resource.Resource) (*sdklog.LoggerProvider, sdklog.Record) {
	// Keys are unique by construction (appendEventAttributes), so the SDK's deduplication, a
	// map per record, would find nothing.
	buf := &recordBuffer{}
	opts := []sdklog.LoggerProviderOption{sdklog.WithProcessor(buf), sdklog.WithAllowKeyDuplication()}
	if res != nil {
		opts = append(opts, sdklog.WithResource(res))
	}
	provider := sdklog.NewLoggerProvider(opts...)
	provider.Logger("github.com/sandgate/sandgate/audit").Emit(context.Background(), otellog.Record{})
	return provider, buf.record
}

// recordBuffer is the LoggerProvider's one processor: it keeps a copy of the record emitted.
type recordBuffer struct {
	record sdklog.Record
}

// OnEmit keeps a copy of r: the SDK reuses r after the call.
func (b *recordBuffer) OnEmit(_ context.Context, r *sdklog.Record) error {
	b.record = r.Clone()
	return nil
}

func (b *recordBuffer) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (b *recordBuffer) Shutdown(context.Context) error                         { return nil }
func (b *recordBuffer) ForceFlush(context.Context) error                       { return nil }
