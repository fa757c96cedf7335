package audit

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	collogpb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	logpb "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"
)

// sdkEncoder is the reference otlpEncoder is held to: the same lines as the log SDK's records
// (filled by the mapping of otlp_record.go, as the exporter did before it encoded them itself),
// turned into a request by the SDK's OTLP/HTTP exporter, whose body a loopback receiver keeps.
type sdkEncoder struct {
	provider  *sdklog.LoggerProvider
	prototype sdklog.Record
	exporter  *otlploghttp.Exporter
	mu        sync.Mutex
	body      []byte
}

func newSDKEncoder(t testing.TB, res *resource.Resource) *sdkEncoder {
	s := &sdkEncoder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.body = b
		s.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	exp, err := otlploghttp.New(context.Background(), otlploghttp.WithEndpointURL(srv.URL+"/v1/logs"), otlploghttp.WithInsecure(),
		otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	s.exporter = exp
	s.provider, s.prototype = newRecordProvider(res)
	return s
}

// request is the SDK's request for lines, or the error its marshal or send gave.
func (s *sdkEncoder) request(lines [][]byte, observed time.Time) (*collogpb.ExportLogsServiceRequest, error) {
	var d lineDecoder
	recs := make([]sdklog.Record, len(lines))
	for i, line := range lines {
		recs[i] = s.prototype
		fillRecord(&recs[i], &d, line, observed, nil)
	}
	if err := s.exporter.Export(context.Background(), recs); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	req := &collogpb.ExportLogsServiceRequest{}
	return req, proto.Unmarshal(s.body, req)
}

// decodeRequest is what a receiver reads from body.
func decodeRequest(t testing.TB, body []byte) *collogpb.ExportLogsServiceRequest {
	t.Helper()
	req := &collogpb.ExportLogsServiceRequest{}
	require.NoError(t, proto.Unmarshal(body, req), "the request is a valid ExportLogsServiceRequest")
	return req
}

// encodedRecords are the records of the request otlpEncoder makes of lines.
func encodedRecords(t testing.TB, lines ...[]byte) []*logpb.LogRecord {
	t.Helper()
	req := decodeRequest(t, newOTLPEncoder(nil).encode(lines, time.Now()))
	require.Len(t, req.ResourceLogs, 1)
	require.Len(t, req.ResourceLogs[0].ScopeLogs, 1)
	return req.ResourceLogs[0].ScopeLogs[0].LogRecords
}

// encoderCorpus are lines of every shape the exporter meets: events of each mapping, strings that
// need escaping, lines that are not events, a line that is not UTF-8.
func encoderCorpus(t testing.TB) [][]byte {
	evs := append(mappingEvents(), testEvent(1), benchRouteEvent(7),
		Event{Kind: KindHTTPConnect, Decision: Decision{Reason: "host \"evil\" <denied> \u2028 \\ é 😀"},
			Target: Target{Host: "[::1]:443", Path: "/a\tb\x01"}, Outcome: Outcome{Error: "denied"}},
		Event{Kind: KindMCPRejected, Outcome: Outcome{Status: 400, Error: "bad_host"}},
		Event{Kind: KindHTTPRequest, Target: Target{Host: "no-port.example"}, Outcome: Outcome{TokensIn: -1, Status: 1 << 40}})
	lines := sealedLines(t, evs)
	good := string(lines[0])
	return append(lines,
		[]byte(`{"id":"x","kind":"mcp.tools_call"}`),
		[]byte(strings.Replace(good, `"status":502`, `"status":"502"`, 1)),
		[]byte("{\"id\":\"damaged\",\"kind\":\"mcp.tools_call\",\"note\":\"\xff\xfe\"}"),
		[]byte(`{"id":"\ud800","kind":"x"}`),
		[]byte(``))
}

// sameRequest fails t unless two requests are the same message (proto3 equality: field order
// and a zero value left out or sent do not count).
func sameRequest(t testing.TB, want, got *collogpb.ExportLogsServiceRequest) {
	t.Helper()
	if proto.Equal(want, got) {
		return
	}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Fatalf("the encoder and the SDK differ (-SDK +encoder):\n%s", d)
	}
	t.Fatal("the encoder and the SDK differ, and cmp.Diff sees no difference")
}

// TestOTLPEncoderAgreesWithTheSDK: the request the exporter writes itself is, message for
// message, the one the OpenTelemetry SDK's exporter makes of the same records: lines of every
// shape, alone and in a batch, under the default resource and under one with attributes of
// every type and a schema URL.
func TestOTLPEncoderAgreesWithTheSDK(t *testing.T) {
	lines := encoderCorpus(t)
	custom, err := resource.New(context.Background(), resource.WithSchemaURL("https://opentelemetry.io/schemas/1.26.0"),
		resource.WithAttributes(attribute.String("service.name", "sandgate"), attribute.String("service.instance.id", "r-1"),
			attribute.String("", "empty key"), attribute.String("empty", ""), attribute.Bool("b", true), attribute.Bool("f", false),
			attribute.Int64("n", -7), attribute.Int64("zero", 0), attribute.Float64("x", 1.5),
			attribute.StringSlice("ss", []string{"a", "", "é"}), attribute.Int64Slice("is", []int64{1, -2}),
			attribute.BoolSlice("bs", []bool{true, false}), attribute.Float64Slice("fs", []float64{0, 2.25}),
			attribute.KeyValue{Key: "bytes", Value: attribute.ByteSliceValue([]byte{0, 1, 2})},
			attribute.KeyValue{Key: "map", Value: attribute.MapValue(attribute.String("k", "v"))},
			attribute.KeyValue{Key: "slice", Value: attribute.SliceValue(attribute.StringValue("s"), attribute.Int64Value(3))}))
	require.NoError(t, err)
	observed := time.Date(2026, 12, 2, 10, 0, 0, 123, time.UTC)
	for name, res := range map[string]*resource.Resource{"default resource": nil, "resource of every type": custom} {
		t.Run(name, func(t *testing.T) {
			sdk := newSDKEncoder(t, res)
			enc := newOTLPEncoder(res)
			for _, line := range lines {
				want, err := sdk.request([][]byte{line}, observed)
				require.NoError(t, err, "%q", line)
				sameRequest(t, want, decodeRequest(t, enc.encode([][]byte{line}, observed)))
			}
			want, err := sdk.request(lines, observed)
			require.NoError(t, err)
			sameRequest(t, want, decodeRequest(t, enc.encode(lines, observed)))
			// The encoder's buffers are reused: a second batch is encoded alike.
			sameRequest(t, want, decodeRequest(t, enc.encode(lines, observed)))
		})
	}
}

// FuzzOTLPEncoder: whatever a line holds, the request is a valid ExportLogsServiceRequest (its
// strings UTF-8) with one record per line, and, whenever the SDK's exporter can send the same
// records, the same message as its.
func FuzzOTLPEncoder(f *testing.F) {
	for _, line := range encoderCorpus(f) {
		f.Add(line)
	}
	observed := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	sdk := newSDKEncoder(f, nil)
	f.Fuzz(func(t *testing.T, line []byte) {
		got := decodeRequest(t, newOTLPEncoder(nil).encode([][]byte{line, line}, observed))
		require.Len(t, got.ResourceLogs[0].ScopeLogs[0].LogRecords, 2)
		if want, err := sdk.request([][]byte{line, line}, observed); err == nil {
			sameRequest(t, want, got)
		}
	})
}

// TestOTLPEncoderMakesAResourceUTF8: a resource attribute that is not UTF-8 (from
// OTEL_RESOURCE_ATTRIBUTES, which may hold anything) is sent with U+FFFD in its place; sent as
// it is, it would make the Collector refuse every request, and the SDK's exporter fails to
// marshal it.
func TestOTLPEncoderMakesAResourceUTF8(t *testing.T) {
	res := resource.NewSchemaless(attribute.String("team\xff", "a\xfeb"), attribute.StringSlice("list", []string{"ok", "\xc3"}))
	req := decodeRequest(t, newOTLPEncoder(res).encode(encoderCorpus(t)[:1], time.Now()))
	got := map[string]any{}
	for _, kv := range req.ResourceLogs[0].Resource.Attributes {
		if a := kv.Value.GetArrayValue(); a != nil {
			got[kv.Key] = []string{a.Values[0].GetStringValue(), a.Values[1].GetStringValue()}
			continue
		}
		got[kv.Key] = kv.Value.GetStringValue()
	}
	require.Equal(t, map[string]any{"team\uFFFD": "a\uFFFDb", "list": []string{"ok", "\uFFFD"}}, got)
}
