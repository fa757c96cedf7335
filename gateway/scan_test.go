package gateway

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/jsonscan"
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

// checkResultScans: asksForInput may say yes where encoding/json says no, never the reverse.
func checkResultScans(t *testing.T, raw []byte) {
	var ir inputRequired
	if json.Unmarshal(raw, &ir) == nil && ir.ResultType == mcp.ResultTypeInputRequired {
		assert.True(t, asksForInput(raw), "asks for input")
	}
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

// TestSandboxMessageReadsAsEncodingJSONDoes: what readMessage reads of a message the guard lets
// through (jsonscan.Unambiguous) is what encoding/json reads: the envelope and every params
// member the gateway reads.
func TestSandboxMessageReadsAsEncodingJSONDoes(t *testing.T) {
	for _, raw := range sandboxMessages {
		t.Run(raw, func(t *testing.T) { checkReadMessage(t, []byte(raw)) })
	}
}

func FuzzReadMessage(f *testing.F) {
	for _, raw := range sandboxMessages {
		f.Add([]byte(raw))
	}
	f.Add([]byte(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"NAME":"echo","Arguments":{"a":1},"_META":{"progressToken":"t"}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"x","method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},"requestState":"s","inputResponses":{"k":{}}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) { checkReadMessage(t, raw) })
}

// jsonMessage is a message as encoding/json reads the members readMessage reads.
type jsonMessage struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Params *struct {
		Name           json.RawMessage `json:"name"`
		URI            json.RawMessage `json:"uri"`
		Arguments      json.RawMessage `json:"arguments"`
		Meta           json.RawMessage `json:"_meta"`
		Cursor         json.RawMessage `json:"cursor"`
		TaskID         json.RawMessage `json:"taskId"`
		RequestState   json.RawMessage `json:"requestState"`
		InputResponses json.RawMessage `json:"inputResponses"`
	} `json:"params"`
}

func checkReadMessage(t *testing.T, raw []byte) {
	if jsonscan.Unambiguous(raw) != nil {
		return // refused before anything reads it
	}
	got, err := readMessage(bytes.TrimSpace(raw))
	var want jsonMessage
	if json.Unmarshal(raw, &want) != nil {
		require.Error(t, err, "readMessage read what encoding/json refuses")
		return
	}
	if err != nil {
		return // refused as not a JSON-RPC message (a by-position params, an id of another type …)
	}
	assert.Equal(t, want.Method, got.Method)
	if string(want.ID) == "null" {
		want.ID = nil
	}
	assert.Equal(t, string(want.ID), string(got.ID))
	if want.Params == nil {
		return
	}
	nonNull := func(r json.RawMessage) string {
		if string(r) == "null" {
			return ""
		}
		return string(r)
	}
	p, q := want.Params, got.p
	for _, pair := range [][2]string{{nonNull(p.Name), string(q.name)}, {nonNull(p.URI), string(q.uri)},
		{nonNull(p.Arguments), string(q.arguments)}, {nonNull(p.Meta), string(q.meta)}, {nonNull(p.Cursor), string(q.cursor)},
		{nonNull(p.TaskID), string(q.taskID)}, {nonNull(p.RequestState), string(q.requestState)},
		{nonNull(p.InputResponses), string(q.inputResponses)}} {
		assert.Equal(t, pair[0], pair[1])
	}
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
