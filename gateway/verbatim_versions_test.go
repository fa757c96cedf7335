package gateway

import (
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// modernDiscover is rawUpstream's server/discover result in modern mode.
const modernDiscover = `{"resultType":"complete","supportedVersions":["2026-07-28"],` +
	`"capabilities":{"tools":{},"resources":{},"prompts":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"raw","version":"1"}}}`

// askModel is rawUpstream's tools/call of ask-model: first a multi round-trip request for a
// sampling (SEP-2322), then, when the call comes back with the answer and the request state, a
// result quoting it.
func askModel(params json.RawMessage) json.RawMessage {
	var p struct {
		InputResponses map[string]struct {
			Content struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"inputResponses"`
		RequestState string `json:"requestState"`
	}
	_ = json.Unmarshal(params, &p)
	answer, ok := p.InputResponses["q"]
	if !ok || p.RequestState != "state-1" {
		return json.RawMessage(`{"resultType":"input_required","requestState":"state-1","inputRequests":{"q":` +
			`{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"six times seven?"}}],"maxTokens":10}}}}`)
	}
	b, _ := json.Marshal(map[string]any{"resultType": "complete", "content": []any{
		map[string]any{"type": "text", "text": "model says: " + answer.Content.Text, "_meta": map[string]any{"k": "v"}},
	}})
	return b
}

// TestResultsAreVerbatimUnderEachVersion: whichever revision Sandgate negotiates with the
// upstream (2026-07-28, or the legacy one when the upstream has no server/discover), results
// (tools/call, resources/read, prompts/get) and every list reach the sandbox as the upstream
// wrote them: content types and fields no revision defines, annotations, _meta,
// structuredContent, the tools' schemas.
func TestResultsAreVerbatimUnderEachVersion(t *testing.T) {
	for _, tt := range []struct {
		name    string
		modern  bool
		version string
	}{
		{"2026-07-28", true, mcp.LATEST_PROTOCOL_VERSION},
		{"legacy", false, "2025-06-18"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := startRawUpstream(t, "testdata/rich-catalog.json")
			up.mu.Lock()
			up.modern = tt.modern
			up.mu.Unlock()
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
			h.waitReady(t)
			direct, through := openRawSession(t, up.URL(), "127.0.0.1"), openRawSession(t, h.URL(), "127.0.0.2")

			for _, k := range []listKind{listTools, listPrompts, listResources, listTemplates} {
				want := resultEntries(t, direct.call(string(k.method), nil), k.array)
				require.NotEmpty(t, want)
				assertSameJSON(t, want, resultEntries(t, through.call(string(k.method), nil), k.array), string(k.method))
			}
			for _, c := range []struct {
				method string
				params map[string]any
				want   string
			}{
				{"tools/call", map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"}}, richResult},
				{"resources/read", map[string]any{"uri": "note://rich/readme"}, richRead},
				{"prompts/get", map[string]any{"name": "echo_prompt", "arguments": map[string]any{"a": "x"}}, richPrompt},
			} {
				assert.JSONEq(t, c.want, string(through.call(c.method, c.params)), c.method)
			}
			// A call with progress reaches the sandbox on an SSE stream: the result is the same.
			withProgress := map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"},
				"_meta": map[string]any{"progressToken": "p-1"}}
			res, before := through.callStream("tools/call", withProgress)
			assert.JSONEq(t, richResult, string(res), "tools/call with progress")
			require.Len(t, before, 1)
			assert.Equal(t, "notifications/progress", before[0].Method)
			assert.Equal(t, "p-1", before[0].Params["progressToken"])
			calls := up.received("tools/call")
			require.NotEmpty(t, calls)
			assert.Equal(t, tt.version, protocolVersionOf(t, calls[len(calls)-1]), "the revision Sandgate spoke upstream")
		})
	}
}

// protocolVersionOf is the revision a request was sent on: its _meta's on 2026-07-28, else
// the session's (the raw upstream answers initialize with 2025-06-18).
func protocolVersionOf(t *testing.T, m rpcEnvelope) string {
	t.Helper()
	var p struct {
		Meta map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(m.Params, &p))
	if v, ok := p.Meta[mcp.MetaKeyProtocolVersion].(string); ok {
		return v
	}
	return "2025-06-18"
}

// TestModernUpstreamAsksForInputMidCall: a 2026-07-28 upstream that needs a sampling mid-call
// answers input_required; Sandgate asks the calling sandbox, sends the call again with the
// answer and the upstream's request state, and the sandbox gets the final result.
func TestModernUpstreamAsksForInputMidCall(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	up.mu.Lock()
	up.modern = true
	up.mu.Unlock()
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	sampler := &samplingClient{answer: "forty-two"}
	c := connectSamplingSandbox(t, h.URL(), "127.0.0.2", sampler)

	res, err := callTool(t, c, "ask-model", nil)
	require.NoError(t, err)
	require.False(t, res.IsError, resultText(res))
	assert.Equal(t, "model says: forty-two", resultText(res))
	assert.EqualValues(t, 1, sampler.calls.Load())
	calls := up.received("tools/call")
	require.Len(t, calls, 2, "the call, then the call with the answer")
	var again struct {
		Name           string                     `json:"name"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
		RequestState   string                     `json:"requestState"`
	}
	require.NoError(t, json.Unmarshal(calls[1].Params, &again))
	assert.Equal(t, "ask-model", again.Name)
	assert.Equal(t, "state-1", again.RequestState)
	assert.Contains(t, string(again.InputResponses["q"]), "forty-two")
}
