package gateway

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// TestListsAreVerbatimExceptNamesAndHidden compares every list of an upstream with rich
// objects ($schema, allOf, if/then/else, $defs, outputSchema, annotations, _meta, icons, title,
// fields no revision defines yet) read directly and through Sandgate, as JSON: equal except the
// prefixed names, and the entries policy hides.
func TestListsAreVerbatimExceptNamesAndHidden(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixAlways})
	h.waitReady(t)
	direct := openRawSession(t, up.URL(), "127.0.0.1")
	full := openRawSession(t, h.URL(), "127.0.0.2")
	narrow := openRawSession(t, h.URL(), "127.0.0.3") // policy: only "echo"

	for _, k := range []listKind{listTools, listPrompts, listResources, listTemplates} {
		t.Run(string(k.method), func(t *testing.T) {
			want := resultEntries(t, direct.call(string(k.method), nil), k.array)
			require.NotEmpty(t, want)
			var wantFull, wantNarrow []map[string]json.RawMessage
			for _, e := range want {
				var id string
				require.NoError(t, json.Unmarshal(e[k.key], &id))
				if k.key == "name" {
					e["name"], _ = json.Marshal("rich_" + id)
				}
				wantFull = append(wantFull, e)
				if id == "echo" {
					wantNarrow = append(wantNarrow, e)
				}
			}
			assertSameJSON(t, wantFull, resultEntries(t, full.call(string(k.method), nil), k.array), "full sandbox")
			assertSameJSON(t, wantNarrow, resultEntries(t, narrow.call(string(k.method), nil), k.array), "narrow sandbox")
		})
	}
}

func resultEntries(t *testing.T, result json.RawMessage, array string) []map[string]json.RawMessage {
	t.Helper()
	var res map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(result, &res))
	var out []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(orNull(res[array]), &out))
	return out
}

func assertSameJSON(t *testing.T, want, got any, msg string) {
	t.Helper()
	w, err := json.Marshal(want)
	require.NoError(t, err)
	g, err := json.Marshal(got)
	require.NoError(t, err)
	if string(w) == "null" {
		w = []byte("[]")
	}
	if string(g) == "null" {
		g = []byte("[]")
	}
	assert.JSONEq(t, string(w), string(g), msg)
}

// TestResultsAreVerbatim: tools/call, resources/read and prompts/get results reach the sandbox
// as the upstream wrote them (content items with their annotations and _meta, a content type
// mcp-go does not know, structuredContent, _meta).
func TestResultsAreVerbatim(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	direct, through := openRawSession(t, up.URL(), "127.0.0.1"), openRawSession(t, h.URL(), "127.0.0.2")
	for _, tt := range []struct {
		method string
		params map[string]any
	}{
		{"tools/call", map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"}}},
		{"resources/read", map[string]any{"uri": "note://rich/readme"}},
		{"prompts/get", map[string]any{"name": "echo_prompt", "arguments": map[string]any{"a": "x"}}},
	} {
		t.Run(tt.method, func(t *testing.T) {
			assert.JSONEq(t, string(direct.call(tt.method, tt.params)), string(through.call(tt.method, tt.params)))
		})
	}
}

// TestArgumentsReachTheUpstreamAsWritten: a tools/call's arguments reach the upstream as the
// sandbox wrote them, on each protocol revision: an integer past 2^53 keeps its digits, keys
// keep their order, numbers their spelling.
func TestArgumentsReachTheUpstreamAsWritten(t *testing.T) {
	const args = `{"z":9007199254740993,"a":[1.0,1e2,-0],"m":{"y":"\u00e9","x":null}}`
	for _, modern := range []bool{false, true} {
		t.Run(map[bool]string{false: "2025-06-18", true: "2026-07-28"}[modern], func(t *testing.T) {
			up := startRawUpstream(t, "testdata/rich-catalog.json")
			up.modern = modern
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
			h.waitReady(t)
			s := openRawSession(t, h.URL(), "127.0.0.2")
			s.call("tools/call", map[string]any{"name": "echo", "arguments": json.RawMessage(args)})
			calls := up.received("tools/call")
			require.Len(t, calls, 1)
			var p struct {
				Arguments json.RawMessage `json:"arguments"`
			}
			require.NoError(t, json.Unmarshal(calls[0].Params, &p))
			assert.Equal(t, args, string(p.Arguments))
		})
	}
}
