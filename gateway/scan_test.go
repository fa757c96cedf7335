package gateway

import (
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each case is read by the scans and by encoding/json, the reading they stand for.
var resultTopLevels = []string{
	`{"content":[{"type":"text","text":"hi"}]}`,
	`{"content":[],"isError":true,"_meta":{"k":1},"structuredContent":{"a":[1,2]}}`,
	`{"content":[],"resultType":"complete"}`,
	`{"content":[],"resultType":"input_required","inputRequests":{},"requestState":"s"}`,
	`{"resultType":"input\u005frequired","inputRequests":{"a":{"method":"roots/list"}}}`,
	`{"ResultType":"input_required"}`,
	`{"RESULTTYPE":"input_required"}`,
	`{"r\u0065sultType":"input_required"}`,
	`{"resultType":"complete","resultType":"input_required"}`,
	`{"content":[],"extra":{"x":"\u00e9"},"later":[1,{"y":null}],"resultType":"complete"}`,
	`{"content":[],"extra":1,"extra":2}`,
	`{"\u0063ontent":[],"other":true}`,
	`{"contents":[],"Content":[]}`,
	"{\"ſ\":1,\"content\":[]}",
	` {"content" : [ ] , "x" : "y" } `,
	`{}`,
	`[]`,
	`{"content":[]`,
	`{"content":[]} {}`,
	`null`,
}

func TestResultScansReadAsEncodingJSONDoes(t *testing.T) {
	for _, raw := range resultTopLevels {
		t.Run(raw, func(t *testing.T) { checkResultScans(t, []byte(raw)) })
	}
}

func FuzzResultScans(f *testing.F) {
	for _, raw := range resultTopLevels {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkResultScans(t, raw) })
}

// checkResultScans: asksForInput may say yes where encoding/json says no, never the reverse;
// extraFields is the decoded map less the known and hop fields.
func checkResultScans(t *testing.T, raw []byte) {
	var ir inputRequired
	if json.Unmarshal(raw, &ir) == nil && ir.ResultType == mcp.ResultTypeInputRequired {
		assert.True(t, asksForInput(raw), "asks for input")
	}
	known := typedFields[string(mcp.MethodToolsCall)]
	var want map[string]json.RawMessage
	wantErr := json.Unmarshal(raw, &want)
	got, err := extraFields(raw, known)
	if wantErr != nil {
		require.Error(t, err)
		return
	}
	require.NoError(t, err)
	for _, k := range append(append([]string(nil), known...), hopFields...) {
		delete(want, k)
	}
	if len(want) == 0 {
		assert.Empty(t, got)
		return
	}
	assert.Equal(t, want, got)
}

// BenchmarkResultTopLevel is the two reads of a tools/call result's top level: by scan (what
// forwarding does) and by decoding (what it did before).
func BenchmarkResultTopLevel(b *testing.B) {
	raw := []byte(`{"content":[{"type":"text","text":"hello 12345 \u003cb\u003e with some text of a typical tool answer"}],"isError":false,"_meta":{"trace":"abc"}}`)
	known := typedFields[string(mcp.MethodToolsCall)]
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = asksForInput(raw)
			_, _ = extraFields(raw, known)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ir inputRequired
			_ = json.Unmarshal(raw, &ir)
			var fields map[string]json.RawMessage
			_ = json.Unmarshal(raw, &fields)
		}
	})
}

var sandboxMessages = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"m":"x"}}}`,
	`{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"note://x"}}`,
	`{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"URI":"note://hidden","uri":"note://x"}}`,
	`{"jsonrpc":"2.0","id":3,"Method":"initialize"}`,
	`{"jsonrpc":"2.0","id":3,"method":"init\u0069alize"}`,
	`{"jsonrpc":"2.0","id":3,"method":"initialize","method":"ping"}`,
	`{"jsonrpc":"2.0","id":null,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":4,"result":{},"error":null}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	`{"jsonrpc":"2.0","id":5,"method":7}`,
	`{"jsonrpc":"2.0","id":5,"method":"x","params":"str"}`,
	`{"jsonrpc":"2.0","id":5,"method":"x","params":[]}`,
	`{"jsonrpc":"2.0","id":5,"method":"x","params":{"uri":5}}`,
	"{\"reſult\":1}",
	`{"id":1,"method":"x"} x`,
	`{"id":1,"method":"x"`,
	`{}`,
}

func TestMessageScanReadsAsEncodingJSONDoes(t *testing.T) {
	for _, raw := range sandboxMessages {
		t.Run(raw, func(t *testing.T) { checkScanAgainstJSON(t, []byte(raw), scanMessage) })
	}
	for _, raw := range sandboxMessages[:2] { // the common shapes are the scan's to read
		_, ok := scanMessage([]byte(raw))
		assert.True(t, ok, raw)
	}
}

func FuzzMessageScan(f *testing.F) {
	for _, raw := range sandboxMessages {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkScanAgainstJSON(t, raw, scanMessage) })
}

var toolResults = []string{
	`{"content":[{"type":"text","text":"hi"}]}`,
	`{"content":[],"isError":true,"_meta":{"progressToken":1,"k":"v"},"structuredContent":{"a":[1,2]},"other":1}`,
	`{"content":[{"type":"image","data":"x","mimeType":"image/png"}, {"type":"later","x":{}}],"isError":false}`,
	`{"Content":[{"type":"text","text":"hidden"}],"content":[]}`,
	`{"content":[],"content":[{"type":"text","text":"second"}]}`,
	`{"content":null}`,
	`{"content":{}}`,
	`{"content":[],"isError":"yes"}`,
	`{"content":[],"isError":null,"structuredContent":null,"_meta":null}`,
	`{"content":[],"_meta":[]}`,
	"{\"content\":[],\"iſError\":true}",
	`{"c\u006fntent":[]}`,
	`{"content":[1,2,]}`,
	`{"content":[]} []`,
	`{}`,
}

func TestToolResultScanReadsAsEncodingJSONDoes(t *testing.T) {
	for _, raw := range toolResults {
		t.Run(raw, func(t *testing.T) { checkScanAgainstJSON(t, []byte(raw), scanToolResult) })
	}
	for _, raw := range toolResults[:3] { // the common shapes are the scan's to read
		_, ok := scanToolResult([]byte(raw))
		assert.True(t, ok, raw)
	}
}

func FuzzToolResultScan(f *testing.F) {
	for _, raw := range toolResults {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkScanAgainstJSON(t, raw, scanToolResult) })
}

// checkScanAgainstJSON: what scan reads from raw (when it does not leave raw to encoding/json)
// is what json.Unmarshal into T reads.
func checkScanAgainstJSON[T any](t *testing.T, raw []byte, scan func([]byte) (T, bool)) {
	got, ok := scan(raw)
	if !ok {
		return // left to encoding/json
	}
	var want T
	require.NoError(t, json.Unmarshal(raw, &want), "the scan read what encoding/json refuses")
	assert.Equal(t, want, got)
}
