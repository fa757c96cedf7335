package gateway

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVerbatimResultReplacesTheTypedOne(t *testing.T) {
	upstream := `{"content":[{"type":"text","text":"<b>","n":9007199254740993}],"isError":true,` +
		`"resultType":"complete","requestState":"s","x-future":{"a":1},"result\u0054ype":"x"}`
	vr, err := verbatimOf([]byte(upstream))
	require.NoError(t, err)
	assert.Equal(t, []string{"content", "isError", "x-future"}, vr.keys, "hop fields removed, escaped names read")

	cases := []struct{ name, id, msg, want string }{
		{"same id", `7`, `{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}}`,
			`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"<b>","n":9007199254740993}],"isError":true,"x-future":{"a":1}}}`},
		{"same id spelled otherwise, and mcp-go's own member kept", `"\u0061"`, `{"jsonrpc":"2.0","id":"a","result":{"content":[],"resultType":"complete"}}`,
			`{"jsonrpc":"2.0","id":"a","result":{"content":[{"type":"text","text":"<b>","n":9007199254740993}],"isError":true,"x-future":{"a":1},"resultType":"complete"}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := withVerbatimResult([]byte(c.msg), json.RawMessage(c.id), vr)
			require.NoError(t, err)
			assert.Equal(t, c.want, string(out), "the upstream's bytes, not re-encoded")
		})
	}
	for _, other := range []string{
		`{"jsonrpc":"2.0","id":8,"result":{"content":[]}}`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{}}`,
		`{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"m"}}`,
		`not json`,
	} {
		_, err := withVerbatimResult([]byte(other), json.RawMessage(`7`), vr)
		assert.ErrorIs(t, err, errNotAList, "%s is left as it is", other)
	}
}

func TestToolResultForKeepsTheResultForTheWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	ctx, extras := withExtras(context.Background(), "tools/call", json.RawMessage(`1`))
	w := newResponseWriter(rec, nil, "", extras)
	raw := json.RawMessage(`{"content":[{"type":"text","text":"ok"}],"isError":true}`)
	res, err := toolResultFor(ctx)(&raw)
	require.NoError(t, err)
	assert.True(t, res.IsError, "the audit event's outcome reads it")
	w.Header().Set("Content-Type", "application/json")
	_, err = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}` + "\n"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":`+string(raw)+`}`, rec.Body.String())

	noContent := json.RawMessage(`{"isError":false}`)
	_, err = toolResultFor(ctx)(&noContent)
	require.EqualError(t, err, "tools/call result has no content")
	_, err = toolResultFor(context.Background())(&raw)
	require.NoError(t, err, "without the guard's writer, the typed result")
}

// The extras of a resources/read or prompts/get result reach a response whose id mcp-go spelled
// otherwise than the sandbox did.
func TestExtrasReachAnIDSpelledOtherwise(t *testing.T) {
	out, err := addExtras([]byte(`{"jsonrpc":"2.0","id":"a","result":{"contents":[]}}`), json.RawMessage(`"\u0061"`),
		map[string]json.RawMessage{"x-future": json.RawMessage(`true`)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":"a","result":{"contents":[],"x-future":true}}`, string(out))
}
