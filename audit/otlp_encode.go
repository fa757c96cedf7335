package audit

import (
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// otlpScope is the instrumentation scope of every record the exporter sends.
const otlpScope = "github.com/sandgate/sandgate/audit"

// otlpEncoder turns a batch of audit log lines into one serialized OTLP
// ExportLogsServiceRequest (opentelemetry/proto/collector/logs/v1): one ResourceLogs of the
// exporter's resource, one ScopeLogs of otlpScope, one LogRecord per line, mapped as
// otlp_record.go says.
//
// It writes the protobuf wire format itself, with protowire's primitives, instead of filling
// the log SDK's records for its OTLP exporter, which turns each into protobuf message structs
// (an allocation per attribute) and marshals those by reflection: that path was 12.6 µs of CPU
// per line, 86 allocations and 8.7 KB (BenchmarkExport, batch=256), this one is measured by the
// same benchmark (figures in the commit that made it). TestOTLPEncoderAgreesWithTheSDK holds the
// two to the same messages, FuzzOTLPEncoder to lines of any shape.
//
// It is not safe for concurrent use; its buffers are reused from batch to batch, so a request
// returned by encode is valid until the next call.
type otlpEncoder struct {
	resource []byte // ResourceLogs.resource (field 1), tag included, encoded once
	schema   []byte // ResourceLogs.schema_url (field 3), tag included; empty for none
	scope    []byte // ScopeLogs.scope (field 1), tag included

	lines lineDecoder
	attrs []attribute.KeyValue
	rec   []byte // the record being built
	head  []byte // the request up to its first record
	out   []byte
}

// newOTLPEncoder encodes res (nil: the SDK's default resource, as its LoggerProvider uses) and
// the scope once.
func newOTLPEncoder(res *resource.Resource) *otlpEncoder {
	if res == nil {
		res = resource.Default()
	}
	e := &otlpEncoder{}
	if res.Len() > 0 {
		var r []byte
		for _, kv := range res.Attributes() {
			r = appendKeyValue(r, 1, validAttribute(kv)) // Resource.attributes
		}
		e.resource = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), r)
	}
	if s := res.SchemaURL(); s != "" {
		e.schema = appendStringField(nil, 3, s)
	}
	e.scope = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType),
		appendStringField(nil, 1, otlpScope)) // InstrumentationScope.name
	return e
}

// encode returns the request carrying lines, each observed at observed.
func (e *otlpEncoder) encode(lines [][]byte, observed time.Time) []byte {
	// The records are written after room for the longest head (two tags, two lengths of at most
	// 5 bytes, the resource and the scope), which is then filled in front of them: the batch is
	// not copied again.
	room := 2*(1+5) + len(e.resource) + len(e.scope)
	out := append(e.out[:0], make([]byte, room)...)
	for _, line := range lines {
		e.rec = e.appendRecord(e.rec[:0], line, observed)
		out = protowire.AppendTag(out, 2, protowire.BytesType) // ScopeLogs.log_records
		out = protowire.AppendBytes(out, e.rec)
	}
	out = append(out, e.schema...)
	records := len(out) - room - len(e.schema)
	scopeLogs := len(e.scope) + records
	resourceLogs := len(e.resource) + protowire.SizeTag(2) + protowire.SizeBytes(scopeLogs) + len(e.schema)

	head := protowire.AppendTag(e.head[:0], 1, protowire.BytesType) // ExportLogsServiceRequest.resource_logs
	head = protowire.AppendVarint(head, uint64(resourceLogs))
	head = append(head, e.resource...)
	head = protowire.AppendTag(head, 2, protowire.BytesType) // ResourceLogs.scope_logs
	head = protowire.AppendVarint(head, uint64(scopeLogs))
	head = append(head, e.scope...)
	e.head, e.out = head, out
	start := room - len(head)
	copy(out[start:], head)
	return out[start:]
}

// appendRecord appends line's LogRecord fields to b. A line that does not parse is still sent,
// as an ERROR record of event name "audit.unparsed" with the line as its body: the log store must
// not be missing what the file has.
func (e *otlpEncoder) appendRecord(b, line []byte, observed time.Time) []byte {
	b = appendTime(b, 11, observed) // observed_time_unix_nano
	if !utf8.Valid(line) {
		// Only a damaged or edited file has such a line (the writer writes valid UTF-8). OTLP's
		// strings must be UTF-8, and a Collector refuses the whole request for one that is not,
		// so the exporter would send that batch for ever: the line goes as bytes, unparsed.
		b = appendBodyField(b, 7, line) // AnyValue.bytes_value
		return e.appendUnparsed(b, strings.ToValidUTF8(lineID(line), "\uFFFD"), "invalid_utf8")
	}
	b = appendBodyField(b, 1, line) // AnyValue.string_value
	ev, err := e.lines.decode(line)
	if err != nil {
		return e.appendUnparsed(b, lineID(line), "unparsed")
	}
	b = appendTime(b, 1, ev.Time) // time_unix_nano
	sev, text := recordSeverity(&ev)
	b = appendSeverity(b, sev, text)
	e.attrs = appendEventAttributes(e.attrs[:0], &ev)
	for _, kv := range e.attrs {
		b = appendKeyValue(b, 6, kv) // attributes
	}
	if id, err := trace.TraceIDFromHex(ev.TraceID); err == nil {
		b = protowire.AppendTag(b, 9, protowire.BytesType)
		b = protowire.AppendBytes(b, id[:])
	}
	if id, err := trace.SpanIDFromHex(ev.SpanID); err == nil {
		b = protowire.AppendTag(b, 10, protowire.BytesType)
		b = protowire.AppendBytes(b, id[:])
	}
	return appendStringField(b, 12, string(ev.Kind)) // event_name
}

// appendUnparsed appends the fields of the ERROR record "audit.unparsed" of a line that could not
// be read as an event (why: error.type), keeping its event ID when one could be found.
func (e *otlpEncoder) appendUnparsed(b []byte, id, why string) []byte {
	b = appendSeverity(b, otellog.SeverityError, "ERROR")
	b = appendKeyValue(b, 6, attribute.String(AttrEventID, id))
	b = appendKeyValue(b, 6, attribute.String("error.type", why))
	return appendStringField(b, 12, "audit.unparsed")
}

func appendSeverity(b []byte, sev otellog.Severity, text string) []byte {
	b = protowire.AppendTag(b, 2, protowire.VarintType) // severity_number
	b = protowire.AppendVarint(b, uint64(sev))
	return appendStringField(b, 3, text) // severity_text
}

// appendTime appends a fixed64 timestamp field; the zero time (or one before 1970) is left out,
// as proto3 leaves out a zero.
func appendTime(b []byte, num protowire.Number, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	n := t.UnixNano()
	if n <= 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, uint64(n))
}

// appendBodyField appends LogRecord.body (field 5): an AnyValue with v in field num.
func appendBodyField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, 5, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(protowire.SizeTag(num)+protowire.SizeBytes(len(v))))
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// appendStringField appends a string field, left out when empty as proto3 leaves it out.
//
// OTLP's strings must be UTF-8, and a Collector refuses a whole request over one that is not, so
// the exporter would send that batch for ever. A record's strings are: its line is checked
// (appendRecord), and fastjson unescapes \u sequences to UTF-8 (U+FFFD for a lone surrogate);
// FuzzOTLPEncoder holds that. The resource's strings are made so once (validAttribute).
func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// validAttribute is kv with U+FFFD in place of bytes that are not UTF-8 in its key and string
// values (a resource attribute comes from OTEL_RESOURCE_ATTRIBUTES, which may hold anything).
func validAttribute(kv attribute.KeyValue) attribute.KeyValue {
	kv.Key = attribute.Key(validUTF8(string(kv.Key)))
	switch kv.Value.Type() {
	case attribute.STRING:
		kv.Value = attribute.StringValue(validUTF8(kv.Value.AsString()))
	case attribute.STRINGSLICE:
		ss := kv.Value.AsStringSlice()
		for i := range ss {
			ss[i] = validUTF8(ss[i])
		}
		kv.Value = attribute.StringSliceValue(ss)
	}
	return kv
}

// validUTF8 is s with U+FFFD in place of bytes that are not UTF-8.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// appendKeyValue appends kv as a KeyValue message in field num. The sizes of the record's own
// attributes (strings, integers, booleans) are computed rather than encoded twice, so a record
// allocates nothing; a resource's other kinds of values are encoded once, at start-up, and their
// nested strings made UTF-8 there.
func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	key := string(kv.Key)
	var val []byte
	var str string
	n := scalarSize(kv.Value)
	switch {
	case kv.Value.Type() == attribute.STRING:
		str = kv.Value.AsString()
		n = protowire.SizeTag(1) + protowire.SizeBytes(len(str))
	case n < 0:
		val = appendAnyValue(nil, kv.Value)
		n = len(val)
	}
	size := protowire.SizeTag(2) + protowire.SizeBytes(n)
	if key != "" {
		size += protowire.SizeTag(1) + protowire.SizeBytes(len(key))
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendStringField(b, 1, key)                   // KeyValue.key
	b = protowire.AppendTag(b, 2, protowire.BytesType) // KeyValue.value
	b = protowire.AppendVarint(b, uint64(n))
	switch {
	case kv.Value.Type() == attribute.STRING:
		b = protowire.AppendTag(b, 1, protowire.BytesType) // AnyValue.string_value
		return protowire.AppendString(b, str)
	case val != nil:
		return append(b, val...)
	}
	return appendAnyValue(b, kv.Value)
}

// scalarSize is the encoded size of an AnyValue holding v when v is an integer, a boolean or a
// float, and -1 otherwise (a string's is appendKeyValue's, which checks it once). A oneof member is sent even when zero: its presence is
// the value's type.
func scalarSize(v attribute.Value) int {
	switch v.Type() {
	case attribute.INT64:
		return protowire.SizeTag(3) + protowire.SizeVarint(uint64(v.AsInt64()))
	case attribute.BOOL:
		return protowire.SizeTag(2) + 1
	case attribute.FLOAT64:
		return protowire.SizeTag(4) + protowire.SizeFixed64()
	case attribute.EMPTY:
		return 0
	}
	return -1
}

// appendAnyValue appends the fields of an AnyValue holding v, as the OpenTelemetry exporters map
// attribute values (a type they do not know is the string "INVALID").
func appendAnyValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.STRING:
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		return protowire.AppendString(b, validUTF8(v.AsString()))
	case attribute.BOOL:
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		return protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, 4, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		return protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.EMPTY:
		return b
	case attribute.MAP:
		var list []byte
		for _, kv := range v.AsMap() {
			list = appendKeyValue(list, 1, kv) // KeyValueList.values
		}
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		return protowire.AppendBytes(b, list)
	}
	var elems []attribute.Value
	switch v.Type() {
	case attribute.BOOLSLICE:
		elems = values(v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		elems = values(v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		elems = values(v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		elems = values(v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		elems = v.AsSlice()
	default:
		return appendAnyValue(b, attribute.StringValue("INVALID"))
	}
	var array []byte
	for _, x := range elems {
		array = protowire.AppendTag(array, 1, protowire.BytesType) // ArrayValue.values
		array = protowire.AppendBytes(array, appendAnyValue(nil, x))
	}
	b = protowire.AppendTag(b, 5, protowire.BytesType)
	return protowire.AppendBytes(b, array)
}

// values is xs as attribute values, for an ArrayValue.
func values[T any](xs []T, value func(T) attribute.Value) []attribute.Value {
	out := make([]attribute.Value, len(xs))
	for i, x := range xs {
		out[i] = value(x)
	}
	return out
}
