package audit

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
)

// The exporter's records as the OpenTelemetry log SDK's: how the exporter built them before it
// encoded its requests itself, kept as the reference the encoder is held to
// (TestOTLPEncoderAgreesWithTheSDK, FuzzOTLPEncoder). The mapping itself is shared
// (recordSeverity, appendEventAttributes); what differs is only who writes the protobuf.

// fillRecord maps one log line, read with d, onto rec, which holds the provider's resource and scope (a copy
// of the exporter's prototype record), and returns attrs' storage for the next line. A line that
// does not parse is still sent, as an ERROR record of event name "audit.unparsed" with the line
// as its body: the log store must not be missing what the file has.
//
// The record is filled through the SDK record's setters rather than emitted through a Logger:
// Emit copies every attribute three times (into the API record, the SDK record, and the clone a
// processor must take), which cost more than the mapping itself.
func fillRecord(rec *sdklog.Record, d *lineDecoder, line []byte, observed time.Time, attrs []attribute.KeyValue) []attribute.KeyValue {
	rec.SetObservedTimestamp(observed)
	if !utf8.Valid(line) {
		// Only a damaged or edited file has such a line (the writer writes valid UTF-8). OTLP's
		// string values must be UTF-8: one such string fails the whole batch's marshal, and the
		// exporter would retry that batch for ever. The line goes as bytes, unparsed.
		rec.SetBody(attribute.ByteSliceValue(line))
		return unparsedRecord(rec, strings.ToValidUTF8(lineID(line), "\uFFFD"), "invalid_utf8", attrs)
	}
	rec.SetBody(attribute.StringValue(string(line)))
	ev, err := d.decode(line)
	if err != nil {
		return unparsedRecord(rec, lineID(line), "unparsed", attrs)
	}
	rec.SetEventName(string(ev.Kind))
	rec.SetTimestamp(ev.Time)
	sev, text := recordSeverity(&ev)
	rec.SetSeverity(sev)
	rec.SetSeverityText(text)
	attrs = appendEventAttributes(attrs[:0], &ev)
	rec.SetAttributes(attrs...) // copies attrs
	rec.SetTraceID(trace.TraceID{})
	if id, err := trace.TraceIDFromHex(ev.TraceID); err == nil {
		rec.SetTraceID(id)
	}
	rec.SetSpanID(trace.SpanID{})
	if id, err := trace.SpanIDFromHex(ev.SpanID); err == nil {
		rec.SetSpanID(id)
	}
	return attrs
}

// unparsedRecord makes rec the ERROR record "audit.unparsed" of a line that could not be read as
// an event (why: error.type), keeping its event ID when one could be found.
func unparsedRecord(rec *sdklog.Record, id, why string, attrs []attribute.KeyValue) []attribute.KeyValue {
	rec.SetEventName("audit.unparsed")
	rec.SetSeverity(otellog.SeverityError)
	rec.SetSeverityText("ERROR")
	rec.SetTimestamp(time.Time{})
	rec.SetTraceID(trace.TraceID{})
	rec.SetSpanID(trace.SpanID{})
	attrs = append(attrs[:0], attribute.String(AttrEventID, id), attribute.String("error.type", why))
	rec.SetAttributes(attrs...)
	return attrs
}

// newRecordProvider returns a LoggerProvider (of res, nil for the default) and a record as its
// Logger builds it, with the provider's resource, scope, limits and key handling: the prototype
// of every reference record.
func newRecordProvider(res *resource.Resource) (*sdklog.LoggerProvider, sdklog.Record) {
	// Keys are unique by construction (appendEventAttributes), as the encoder assumes too.
	buf := &recordBuffer{}
	opts := []sdklog.LoggerProviderOption{sdklog.WithProcessor(buf), sdklog.WithAllowKeyDuplication()}
	if res != nil {
		opts = append(opts, sdklog.WithResource(res))
	}
	provider := sdklog.NewLoggerProvider(opts...)
	provider.Logger(otlpScope).Emit(context.Background(), otellog.Record{})
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
