package audit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
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
	// Timeout bounds one export; 0: OTEL_EXPORTER_OTLP_LOGS_TIMEOUT, else
	// OTEL_EXPORTER_OTLP_TIMEOUT, else 10s.
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
// It encodes each batch itself (otlpEncoder) and sends it once per attempt (otlpSender),
// configured as the OpenTelemetry exporters are; the SDK's batch processor would drop records
// when its queue is full and never report a failed export, and the file already is the queue.
type OTLPExporter struct {
	*Follower
	sender *otlpSender
	// enc's buffers are reused from batch to batch: Send is never concurrent (the Follower
	// serialises it), and the sender is done with a request when it returns.
	enc *otlpEncoder
}

// NewOTLPExporter builds an exporter of cfg.Dir's log. Start it with Run; Shutdown releases the
// connection. Nothing is dialled here: an unreachable Collector shows in Healthy, not as an
// error; a configuration (or an OTEL_EXPORTER_OTLP_* variable) that cannot be used is one.
func NewOTLPExporter(cfg OTLPConfig) (*OTLPExporter, error) {
	sender, err := newOTLPSender(cfg, nil)
	if err != nil {
		return nil, err
	}
	e := &OTLPExporter{sender: sender, enc: newOTLPEncoder(cfg.Resource)}
	fc := cfg.Follower
	if fc.Linger == 0 {
		fc.Linger = OTLPLinger
	}
	fc.Dir, fc.Name, fc.CursorFile, fc.CursorTag = cfg.Dir, "audit otlp exporter", OTLPCursorFile, otlpCursorTag
	if e.Follower, err = NewFollower(fc, e); err != nil {
		return nil, errors.Join(err, sender.shutdown(context.Background()))
	}
	return e, nil
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
	if err := e.sender.send(ctx, e.enc.encode(lines, time.Now())); err != nil {
		return fmt.Errorf("audit otlp exporter: export %d records: %w", len(lines), err)
	}
	return nil
}

// Shutdown closes the exporter's connection. Call it after the last Sync.
func (e *OTLPExporter) Shutdown(ctx context.Context) error {
	return e.sender.shutdown(ctx)
}
