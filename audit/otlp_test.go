package audit

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	otellog "go.opentelemetry.io/otel/log"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logpb "go.opentelemetry.io/proto/otlp/logs/v1"

	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/test/otelcoltest"
)

// mappingRow is one row of docs/audit.md's mapping table whose first cell is an attribute.
type mappingRow struct{ attr, field string }

// mappingTable reads the attribute rows of the table between the otlp-mapping markers.
func mappingTable(t *testing.T) []mappingRow {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "audit.md"))
	require.NoError(t, err)
	defer f.Close()
	cell := regexp.MustCompile("^`([a-z_.]+)`$")
	var rows []mappingRow
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		switch line := sc.Text(); {
		case line == "<!-- otlp-mapping -->":
			in = true
		case line == "<!-- /otlp-mapping -->":
			in = false
		case in && strings.HasPrefix(line, "| `"):
			cells := strings.Split(strings.Trim(line, "|"), "|")
			a := cell.FindStringSubmatch(strings.TrimSpace(cells[0]))
			fld := cell.FindStringSubmatch(strings.TrimSpace(cells[1]))
			require.NotNil(t, a, "attribute cell of %q", line)
			require.NotNil(t, fld, "event field cell of %q", line)
			rows = append(rows, mappingRow{a[1], fld[1]})
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, rows, "docs/audit.md has the mapping table between its markers")
	return rows
}

// fieldAt is the value at a dotted path of a log line's JSON object.
func fieldAt(t *testing.T, line []byte, path string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(line, &v))
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// mappingEvents are events with every field set, of the kinds that map Target.Tool differently.
func mappingEvents() []Event {
	full := func(kind Kind, tool string) Event {
		return Event{
			Kind: kind,
			Identity: identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coder", Claim: "claim-1",
				Labels: map[string]string{"team": "a"}, SourceIP: "10.0.0.7", Known: true},
			Target: Target{Upstream: "github", Tool: tool, ArgsSHA256: strings.Repeat("ab", 32), Method: "POST",
				Host: "api.example.com:8443", Path: "/v1/messages", Route: "anthropic", Model: "claude-haiku-4-5"},
			Decision:   Decision{Allow: true, Reason: "policy ok", PolicyRevision: "rev-1", WouldDeny: "tool_not_allowed"},
			Credential: "github-token",
			CredentialToken: &CredentialToken{Provider: "github_app", ID: "sha256:0123456789abcdef",
				Expires: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)},
			Limits:  LimitsUnavailable,
			Outcome: Outcome{Status: 502, Error: "upstream_unreachable", DurationMS: 12.5, BytesIn: 100, BytesOut: 2000, TokensIn: 11, TokensOut: 7},
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
			SpanID:  "00f067aa0ba902b7",
		}
	}
	return []Event{full(KindToolsCall, "create_issue"), full(KindResourcesRead, "file:///repo/README.md"), full(KindPromptsGet, "triage")}
}

// sealedLines writes evs to a log and returns their lines as written.
func sealedLines(t testing.TB, evs []Event) [][]byte {
	t.Helper()
	dir := t.TempDir()
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever})
	for i := range evs {
		require.NoError(t, w.Record(&evs[i]))
	}
	require.NoError(t, w.Close(context.Background()))
	return readLines(t, filepath.Join(dir, ActiveFile))
}

// testRecord is the record the exporter sends for line, as a Collector reads it.
func testRecord(t *testing.T, line []byte) *logpb.LogRecord {
	t.Helper()
	recs := encodedRecords(t, line)
	require.Len(t, recs, 1)
	return recs[0]
}

// recordAttrs are a record's attributes by key, with Go values; a key that comes twice fails t
// (nothing deduplicates them).
func recordAttrs(t *testing.T, r *logpb.LogRecord) map[string]any {
	m := map[string]any{}
	for _, kv := range r.Attributes {
		_, dup := m[kv.Key]
		assert.False(t, dup, "attribute %s comes twice", kv.Key)
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = v.IntValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = v.BoolValue
		default:
			t.Errorf("attribute %s has a value of type %T", kv.Key, v)
		}
	}
	return m
}

// derived are the attributes whose value is computed from their field rather than copied.
var derived = map[string]func(line []byte, field any) any{
	"server.address": func(_ []byte, f any) any { return strings.Split(f.(string), ":")[0] },
	"server.port": func(_ []byte, f any) any {
		p, _ := strconv.Atoi(strings.Split(f.(string), ":")[1])
		return int64(p)
	},
	"sandgate.decision": func(_ []byte, f any) any { return map[bool]string{true: "allow", false: "deny"}[f.(bool)] },
	"mcp.method.name":   func(_ []byte, f any) any { return mcpMethods[Kind(f.(string))] },
}

// TestOTLPRecordFollowsTheMappingTable holds the exporter to docs/audit.md's table: every
// attribute a record has is in the table, and every attribute of the table is on a record, with
// the value of the event field the table names.
func TestOTLPRecordFollowsTheMappingTable(t *testing.T) {
	rows := mappingTable(t)
	documented := map[string]string{}
	for _, r := range rows {
		documented[r.attr] = r.field
	}
	lines := sealedLines(t, mappingEvents())
	seen := map[string]bool{}
	for _, line := range lines {
		rec := testRecord(t, line)
		ev, err := ParseLine(line)
		require.NoError(t, err)
		assert.Equal(t, string(ev.Kind), rec.EventName)
		assert.Equal(t, string(line), rec.Body.GetStringValue(), "the body is the line as written")
		assert.Equal(t, uint64(ev.Time.UnixNano()), rec.TimeUnixNano)
		assert.Equal(t, ev.TraceID, hex.EncodeToString(rec.TraceId))
		assert.Equal(t, ev.SpanID, hex.EncodeToString(rec.SpanId))
		for k, got := range recordAttrs(t, rec) {
			field, ok := documented[k]
			if !assert.True(t, ok, "%s is on the record but not in docs/audit.md's table", k) {
				continue
			}
			seen[k] = true
			want := fieldAt(t, line, field)
			if d, ok := derived[k]; ok {
				want = d(line, want)
			}
			if n, isNum := want.(float64); isNum { // JSON numbers
				want = int64(n)
			}
			assert.Equal(t, want, got, "%s = %s of %s", k, field, ev.Kind)
		}
	}
	for _, r := range rows {
		assert.True(t, seen[r.attr], "docs/audit.md documents %s, which no record carries", r.attr)
	}
}

func TestOTLPRecordSeverity(t *testing.T) {
	cases := []struct {
		name string
		ev   Event
		want otellog.Severity
		text string
	}{
		{"an allowed call is information", Event{Kind: KindToolsCall, Decision: Decision{Allow: true}}, otellog.SeverityInfo, "INFO"},
		{"a denied call is a warning", Event{Kind: KindToolsCall, Outcome: Outcome{Error: "deny"}}, otellog.SeverityWarn, "WARN"},
		{"a rejected request is a warning", Event{Kind: KindMCPRejected, Outcome: Outcome{Error: "bad_host"}}, otellog.SeverityWarn, "WARN"},
		{"an allowed call that failed is an error", Event{Kind: KindHTTPRequest, Decision: Decision{Allow: true}, Outcome: Outcome{Error: "upstream_unreachable"}},
			otellog.SeverityError, "ERROR"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			line := sealedLines(t, []Event{tc.ev})[0]
			rec := testRecord(t, line)
			assert.Equal(t, int32(tc.want), int32(rec.SeverityNumber))
			assert.Equal(t, tc.text, rec.SeverityText)
		})
	}

	rec := testRecord(t, []byte(`{"id":"x","kind":"mcp.tools_call"}`))
	assert.Equal(t, "audit.unparsed", rec.EventName, "a line that does not parse is still sent")
	assert.Equal(t, int32(otellog.SeverityError), int32(rec.SeverityNumber))
}

// otlpRig is a Writer on a FileSink and an OTLPExporter following it into a real Collector.
type otlpRig struct {
	dir  string
	w    *Writer
	col  *otelcoltest.Collector
	next int
}

func newOTLPExporterFor(t *testing.T, dir, protocol string, col *otelcoltest.Collector) *OTLPExporter {
	t.Helper()
	endpoint := col.HTTPEndpoint()
	if protocol == OTLPProtocolGRPC {
		endpoint = col.GRPCEndpoint()
	}
	e, err := NewOTLPExporter(OTLPConfig{Dir: dir, Protocol: protocol, Endpoint: endpoint, Insecure: true,
		Timeout: 2 * time.Second, Headers: map[string]string{"x-test": "1"},
		Follower: FollowerConfig{Batch: 16, Poll: 50 * time.Millisecond, RetryBackoff: 200 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return e
}

func (r *otlpRig) write(t *testing.T, n int) {
	t.Helper()
	for range n {
		ev := testEvent(r.next)
		r.next++
		require.NoError(t, r.w.Record(&ev), "writing the file never depends on the Collector")
	}
	require.Eventually(t, func() bool { return r.w.Stats().Written == uint64(r.next) }, 10*time.Second, time.Millisecond)
}

// exportedIDs counts each event ID in the Collector's output.
func exportedIDs(recs []otelcoltest.Record) map[string]int {
	ids := map[string]int{}
	for _, r := range recs {
		if id, ok := r.Attributes[AttrEventID].(string); ok {
			ids[id]++
		}
	}
	return ids
}

// logIDs is every line's ID in the log, the writer's own records included.
func logIDs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for _, p := range listFiles(t, dir) {
		for _, l := range readLines(t, p) {
			ids[lineID(l)] = true
		}
	}
	return ids
}

// waitForIDs waits until the Collector's file has every ID in want (it flushes every 50ms).
func waitForIDs(t *testing.T, col *otelcoltest.Collector, want map[string]bool) map[string]int {
	t.Helper()
	recs := col.WaitFor(t, 20*time.Second, "the Collector's file has every event", func(recs []otelcoltest.Record) bool {
		got := exportedIDs(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	return exportedIDs(recs)
}

func sameIDs(t *testing.T, want map[string]bool, got map[string]int) {
	t.Helper()
	missing, extra := 0, 0
	for id := range want {
		if got[id] == 0 {
			missing++
		}
	}
	for id := range got {
		if !want[id] {
			extra++
		}
	}
	assert.Zero(t, missing, "events in the file that the Collector never received")
	assert.Zero(t, extra, "records the Collector received that are not in the file")
}

// TestOTLPExporterThroughACollectorRestart: events written while the Collector is down, and by a
// writer whose exporter was replaced (a Sandgate restart), all reach the Collector, each at least
// once, with few repeats; the exporter reports itself behind meanwhile, and the writer never
// waits for it.
func TestOTLPExporterThroughACollectorRestart(t *testing.T) {
	for _, protocol := range []string{OTLPProtocolHTTP, OTLPProtocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			col := otelcoltest.Start(t)
			dir := t.TempDir()
			w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever, MaxSize: 8 << 10})
			r := &otlpRig{dir: dir, w: w, col: col}
			e := newOTLPExporterFor(t, dir, protocol, col)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { _ = e.Run(ctx) })

			r.write(t, 40)
			require.NoError(t, e.Sync(ctxTimeout(t, 20*time.Second)))
			sameIDs(t, logIDs(t, dir), waitForIDs(t, col, logIDs(t, dir)))

			col.Stop()
			start := time.Now()
			r.write(t, 60) // rotates a few times during the outage
			assert.Less(t, time.Since(start), 10*time.Second, "file writes are not held up by the Collector")
			require.Eventually(t, func() bool { return e.Healthy() != nil }, 20*time.Second, 20*time.Millisecond,
				"the exporter reports that it cannot deliver")
			assert.Positive(t, e.Stats().BehindBytes, "and that it is behind")
			assert.Positive(t, e.Stats().Failed)

			// A restart of Sandgate during the outage: the new exporter takes over the cursor.
			cancel()
			wg.Wait()
			require.NoError(t, e.Shutdown(context.Background()))
			e2 := newOTLPExporterFor(t, dir, protocol, col)
			r.write(t, 20)
			col.Restart()
			require.NoError(t, e2.Sync(ctxTimeout(t, 30*time.Second)))
			assert.NoError(t, e2.Healthy())
			assert.Zero(t, e2.Stats().BehindBytes)
			assert.Zero(t, e2.Stats().Relocated, "the cursor was found")

			got := waitForIDs(t, col, logIDs(t, dir))
			sameIDs(t, logIDs(t, dir), got)
			repeats := 0
			for _, n := range got {
				repeats += n - 1
			}
			assert.LessOrEqual(t, repeats, 16, "at most one batch sent twice")
		})
	}
}

// TestOTLPExporterRecordMatchesItsEvent: what the Collector received for one event carries the
// event's fields as the docs say, and the exporter's resource.
func TestOTLPExporterRecordMatchesItsEvent(t *testing.T) {
	col := otelcoltest.Start(t)
	dir := t.TempDir()
	evs := mappingEvents()[:1]
	evs[0].Decision = Decision{Allow: false, Reason: "tool not allowed", PolicyRevision: "rev-2"}
	evs[0].Outcome.Error = "deny"
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever})
	require.NoError(t, w.Record(&evs[0]))
	require.NoError(t, w.Close(context.Background()))
	e := newOTLPExporterFor(t, dir, OTLPProtocolHTTP, col)
	require.NoError(t, e.Sync(ctxTimeout(t, 20*time.Second)))

	line := readLines(t, filepath.Join(dir, ActiveFile))[0]
	ev, err := ParseLine(line)
	require.NoError(t, err)
	recs := col.WaitFor(t, 20*time.Second, "the record reaches the Collector's file", func(r []otelcoltest.Record) bool { return len(r) > 0 })
	require.Len(t, recs, 1)
	got := recs[0]
	assert.Equal(t, string(line), got.Body)
	assert.Equal(t, "mcp.tools_call", got.EventName)
	assert.Equal(t, "WARN", got.SeverityText)
	assert.Equal(t, 13, got.SeverityNumber)
	assert.True(t, got.Timestamp.Equal(ev.Time), "%s != %s", got.Timestamp, ev.Time)
	assert.Equal(t, ev.TraceID, got.TraceID)
	assert.Equal(t, ev.SpanID, got.SpanID)
	want := map[string]any{
		AttrEventID: ev.ID, AttrEventHash: ev.Hash, "client.address": "10.0.0.7", AttrSandbox: "sb-1",
		AttrNamespace: "agents", AttrTemplate: "coder", AttrClaim: "claim-1", AttrDecision: "deny",
		AttrReason: "tool not allowed", AttrPolicyRevision: "rev-2", "mcp.method.name": "tools/call",
		"gen_ai.tool.name": "create_issue", "error.type": "deny", "http.response.status_code": int64(502),
		"gen_ai.usage.input_tokens": int64(11), "server.address": "api.example.com", "server.port": int64(8443),
	}
	for k, v := range want {
		assert.Equal(t, v, got.Attributes[k], k)
	}
	assert.Equal(t, "github.com/sandgate/sandgate/audit", got.Scope)
}

// TestOTLPExporterSendsTheCurrentAuthHeader: a Collector that wants a bearer token gets the
// credential's value at each export, so a rotated credential is used without a restart; without
// it the exporter reports the refusal and catches up once the header is right.
func TestOTLPExporterSendsTheCurrentAuthHeader(t *testing.T) {
	for _, protocol := range []string{OTLPProtocolHTTP, OTLPProtocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			col := otelcoltest.Start(t, otelcoltest.WithBearerToken("right-token"))
			dir := t.TempDir()
			writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 3)
			var mu sync.Mutex
			token := "wrong-token"
			endpoint := col.HTTPEndpoint()
			if protocol == OTLPProtocolGRPC {
				endpoint = col.GRPCEndpoint()
			}
			e, err := NewOTLPExporter(OTLPConfig{Dir: dir, Protocol: protocol, Endpoint: endpoint, Insecure: true, Timeout: 2 * time.Second,
				Auth: func() (string, string) {
					mu.Lock()
					defer mu.Unlock()
					return "Authorization", "Bearer " + token
				}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Shutdown(context.Background()) })

			err = e.Sync(ctxTimeout(t, time.Second))
			require.Error(t, err, "the Collector refuses a wrong token")
			assert.Error(t, e.Healthy())
			mu.Lock()
			token = "right-token" // the credential was rotated
			mu.Unlock()
			require.NoError(t, e.Sync(ctxTimeout(t, 20*time.Second)))
			sameIDs(t, logIDs(t, dir), waitForIDs(t, col, logIDs(t, dir)))
		})
	}
}

// TestOTLPExporterSendsADamagedLineAsBytes: a line that is not UTF-8 (only a damaged or edited
// file has one) reaches the Collector as an "audit.unparsed" record with the line as bytes, and
// the lines around it arrive too: OTLP strings must be UTF-8, and one such string used to fail
// its whole batch at every retry, so the exporter never moved past it.
func TestOTLPExporterSendsADamagedLineAsBytes(t *testing.T) {
	col := otelcoltest.Start(t)
	dir := t.TempDir()
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever})
	first := testEvent(1)
	require.NoError(t, w.Record(&first))
	require.NoError(t, w.Close(context.Background()))
	f, err := os.OpenFile(filepath.Join(dir, ActiveFile), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	damaged := "{\"id\":\"damaged\",\"kind\":\"mcp.tools_call\",\"note\":\"\xff\xfe\"}\n"
	_, err = f.WriteString(damaged)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	e := newOTLPExporterFor(t, dir, OTLPProtocolHTTP, col)
	require.NoError(t, e.Sync(ctxTimeout(t, 20*time.Second)), "the exporter gets past the damaged line")
	recs := col.WaitFor(t, 20*time.Second, "every line reaches the Collector", func(r []otelcoltest.Record) bool {
		return len(r) >= len(readLines(t, filepath.Join(dir, ActiveFile)))
	})
	var unparsed []otelcoltest.Record
	for _, r := range recs {
		if r.EventName == "audit.unparsed" {
			unparsed = append(unparsed, r)
		}
	}
	require.Len(t, unparsed, 1)
	assert.Equal(t, "invalid_utf8", unparsed[0].Attributes["error.type"])
	assert.Contains(t, exportedIDs(recs), first.ID, "the line before it arrived too")
}

// TestOTLPExporterSendsGzipToACollector: with OTEL_EXPORTER_OTLP_COMPRESSION=gzip a real
// Collector receives every line over both protocols (the sender compresses the request it
// encodes itself; the SDK comparison in otlp_send_test.go checks the bytes, this the receiver).
func TestOTLPExporterSendsGzipToACollector(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
	for _, protocol := range []string{OTLPProtocolHTTP, OTLPProtocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			col := otelcoltest.Start(t)
			dir := t.TempDir()
			writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 40)
			e := newOTLPExporterFor(t, dir, protocol, col)
			require.NoError(t, e.Sync(ctxTimeout(t, 20*time.Second)))
			require.True(t, e.sender.gzip, "the variable turned compression on")
			sameIDs(t, logIDs(t, dir), waitForIDs(t, col, logIDs(t, dir)))
		})
	}
}
