package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
)

// A message whose params readers read differently is refused before policy or an upstream
// reads it: policy decodes with encoding/json (the last of a repeated key wins, keys match
// without regard to case) while the upstream gets the sandbox's bytes and may read them
// otherwise. Each refusal is a JSON-RPC invalid-params error and one audit event.
func TestParamsReadDifferentlyAreRefused(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL()})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")

	tests := []struct {
		name   string
		method string
		params string
	}{
		{"a repeated argument (policy reads the last, a first-wins upstream the first)", "tools/call",
			`{"name":"echo","arguments":{"message":"forbidden","message":"hello"}}`},
		{"a repeated key deep in the arguments", "tools/call",
			`{"name":"echo","arguments":{"message":"hello","opts":[{"path":"/ok","path":"/etc"}]}}`},
		{"an argument and its case variant", "tools/call",
			`{"name":"echo","arguments":{"message":"hello","MESSAGE":"forbidden"}}`},
		{"an argument and its escaped spelling", "tools/call",
			`{"name":"echo","arguments":{"message":"hello","m\u0065ssage":"forbidden"}}`},
		{"an argument key that is not UTF-8", "tools/call",
			"{\"name\":\"echo\",\"arguments\":{\"message\":\"hello\",\"m\xffssage\":\"forbidden\"}}"},
		{"half a surrogate pair in a value", "tools/call",
			`{"name":"echo","arguments":{"message":"\ud800"}}`},
		{"arguments that are not an object (policy would read none)", "tools/call",
			`{"name":"echo","arguments":["forbidden"]}`},
		{"the tool named twice", "tools/call",
			`{"name":"echo","name":"defs","arguments":{"message":"hello"}}`},
		{"a prompt argument twice", "prompts/get",
			`{"name":"echo_prompt","arguments":{"who":"a","who":"b"}}`},
		{"a resource URI twice", "resources/read",
			`{"uri":"note://rich/readme","URI":"note://rich/other"}`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := 100 + i
			resp, r := post(t, s.hc, h.URL(), fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, tt.method, tt.params),
				map[string]string{"Mcp-Session-Id": s.sid})
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			require.NotNil(t, r.Error, "a JSON-RPC error")
			assert.Equal(t, codeInvalidParams, r.Error.Code)
			assert.JSONEq(t, fmt.Sprint(id), string(r.ID), "the error answers the request")
		})
	}
	assert.Empty(t, up.received("tools/call"), "no refused call reached the upstream")
	assert.Empty(t, up.received("prompts/get"))
	assert.Empty(t, up.received("resources/read"))

	// A clean call still goes through, to the same session.
	res := s.call("tools/call", map[string]any{"name": "echo", "arguments": map[string]any{"message": "hello"}})
	assert.Contains(t, string(res), `"ok"`)
	require.Len(t, up.received("tools/call"), 1)

	evs := h.auditEvents(t)
	refused := 0
	for _, ev := range evs {
		if ev.Outcome.Error == call.CodeBadParams {
			refused++
			assert.False(t, ev.Decision.Allow)
			assert.Equal(t, http.StatusBadRequest, ev.Outcome.Status)
			assert.Contains(t, []audit.Kind{audit.KindToolsCall, audit.KindPromptsGet, audit.KindResourcesRead}, ev.Kind)
		}
		assert.NotEqual(t, audit.KindMCPRejected, ev.Kind, "each refusal is its request's own event, never rate-limited")
	}
	assert.Equal(t, len(tests), refused, "one event per refused request")
}

// Policy reads the arguments from the bytes the upstream gets, numbers included: an integer
// past 2^53 is the integer the sandbox wrote, not the nearest float64.
func TestPolicyReadsTheArgumentsTheUpstreamGets(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sandgate.rego"), []byte(`package sandgate

decision := {"allow": false, "reason": "account 9007199254740993 is closed", "code": "closed_account"} if {
	input.mcp.arguments.account == 9007199254740993
} else := {"allow": true, "reason": "ok"}
`), 0o644))
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, dir, config.Upstream{Name: "rich", URL: up.URL()})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")

	send := func(account string) json.RawMessage {
		s.id++
		resp, r := post(t, s.hc, h.URL(), fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"account":%s}}}`,
			s.id, account), map[string]string{"Mcp-Session-Id": s.sid})
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Nil(t, r.Error)
		return r.Result
	}
	denied := send("9007199254740993")
	assert.Contains(t, string(denied), "account 9007199254740993 is closed", "policy read the number the sandbox wrote")
	assert.Empty(t, up.received("tools/call"))

	allowed := send("9007199254740992")
	assert.NotContains(t, string(allowed), "closed")
	got := up.received("tools/call")
	require.Len(t, got, 1)
	assert.True(t, strings.Contains(string(got[0].Params), `"account":9007199254740992`), "the upstream got the bytes: %s", got[0].Params)
}
