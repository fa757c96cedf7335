package gateway

import (
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemberReadsAsEncodingJSONDoes(t *testing.T) {
	tests := []struct {
		name, obj, key, want string
	}{
		{"the member of that name", `{"a":1,"arguments":{"x":2}}`, "arguments", `{"x":2}`},
		{"a member in other letter case", `{"ARGUMENTS":[1]}`, "arguments", `[1]`},
		{"a member with escapes", `{"\u0061rguments":"s"}`, "arguments", `"s"`},
		{"no such member", `{"a":1}`, "arguments", ``},
		{"not an object", `[1]`, "arguments", ``},
		{"nothing", ``, "arguments", ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(member([]byte(tt.obj), tt.key)))
		})
	}
}

func TestPolicyArgumentsKeepNumbersAsWritten(t *testing.T) {
	var req mcp.CallToolRequest
	require.NoError(t, json.Unmarshal([]byte(`{"name":"t","arguments":{"n":9007199254740993,"f":1.50,"s":"x"}}`), &req.Params))
	args, err := policyArguments(req)
	require.NoError(t, err)
	assert.Equal(t, json.Number("9007199254740993"), args["n"])
	assert.Equal(t, json.Number("1.50"), args["f"])
	assert.Equal(t, "x", args["s"])

	in := mcp.CallToolRequest{}
	in.Params.Arguments = map[string]any{"k": "v"}
	args, err = policyArguments(in)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"k": "v"}, args, "an in-process request has no raw arguments")
}

// BenchmarkOneReading is the guard's one-reading check (readOnce) of a typical tools/call.
func BenchmarkOneReading(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"create_pull_request",` +
		`"arguments":{"owner":"acme","repo":"api","title":"Fix the flaky test","head":"fix/flaky","base":"main",` +
		`"body":"The test waited on a sleep; it now polls with a deadline.\n\nCloses #12.","draft":false,"labels":["ci","tests"]},` +
		`"_meta":{"progressToken":7}}}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if rf := readOnce(body, "tools/call"); rf != nil {
			b.Fatal(rf.Reason)
		}
	}
}
