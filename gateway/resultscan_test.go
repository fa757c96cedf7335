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
