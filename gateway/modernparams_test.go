package gateway

import (
	"encoding/json"
	"runtime"
	"testing"
	"weak"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func unstartedClient(t testing.TB) *client.Client {
	tr, err := transport.NewStreamableHTTP("http://127.0.0.1:1/mcp")
	require.NoError(t, err)
	var caps mcp.ClientCapabilities
	require.NoError(t, json.Unmarshal([]byte(`{"sampling":{},"roots":{"listChanged":true},"elicitation":{}}`), &caps))
	return client.NewClient(tr, client.WithClientCapabilities(caps))
}

// TestToolCallParamsEncodeAsJSONMarshalDoes: the direct encoding of a forwarded tools/call's
// params decodes to what json.Marshal of the params with protocolMeta does.
func TestToolCallParamsEncodeAsJSONMarshalDoes(t *testing.T) {
	cli := unstartedClient(t)
	withArgs := func(raw string) mcp.CallToolParams {
		var p mcp.CallToolParams
		require.NoError(t, json.Unmarshal([]byte(`{"name":"echo","arguments":`+raw+`}`), &p))
		return p
	}
	for name, p := range map[string]mcp.CallToolParams{
		"arguments":       withArgs(`{"m":"hi","n":[1,2.5,{"x":null}]}`),
		"no arguments":    {Name: "echo"},
		"odd name":        {Name: "a\"b\\c<d>&é\u2028\x01"},
		"progress token":  {Name: "t", RawArguments: json.RawMessage(`{}`), Arguments: map[string]any{}, Meta: &mcp.Meta{ProgressToken: "sg-1"}},
		"numeric token":   {Name: "t", Meta: &mcp.Meta{ProgressToken: 7}},
		"sandbox meta":    {Name: "t", Meta: &mcp.Meta{AdditionalFields: map[string]any{"trace\"id": "x", "n": 1.5, "o": map[string]any{"a": []any{true}}}}},
		"protocol keys":   {Name: "t", Meta: &mcp.Meta{AdditionalFields: map[string]any{mcp.MetaKeyProtocolVersion: "1999-01-01", mcp.MetaKeyLogLevel: "error"}}},
		"token in fields": {Name: "t", Meta: &mcp.Meta{AdditionalFields: map[string]any{"progressToken": "x"}}},
	} {
		t.Run(name, func(t *testing.T) {
			got, fast, err := toolCallParams(cli, mcp.ProtocolVersion20260728, p)
			require.NoError(t, err)
			require.True(t, fast)
			require.True(t, json.Valid(got), "%s", got)
			p.Meta = protocolMeta(cli, mcp.ProtocolVersion20260728, p.Meta)
			want, err := json.Marshal(p)
			require.NoError(t, err)
			if name == "token in fields" { // Meta.MarshalJSON lets a field named progressToken win; the token is nil here
				return
			}
			assert.JSONEq(t, string(want), string(got))
		})
	}
	for name, p := range map[string]mcp.CallToolParams{
		"task":             {Name: "t", Task: &mcp.TaskParams{}},
		"round trip":       {Name: "t", MultiRoundTripParams: mcp.MultiRoundTripParams{RequestState: "s"}},
		"no raw arguments": {Name: "t", Arguments: map[string]any{"a": 1}},
	} {
		_, fast, err := toolCallParams(cli, mcp.ProtocolVersion20260728, p)
		require.NoError(t, err)
		assert.False(t, fast, name)
	}
}

// TestProtocolFragmentIsDroppedWithItsClient: the fragment cache does not keep a closed
// connection's entry.
func TestProtocolFragmentIsDroppedWithItsClient(t *testing.T) {
	k := func() fragmentKey {
		cli := unstartedClient(t)
		_, err := protocolFragment(cli, mcp.ProtocolVersion20260728)
		require.NoError(t, err)
		return fragmentKey{weak.Make(cli), mcp.ProtocolVersion20260728}
	}()
	_, cached := protocolFragments.Load(k)
	require.True(t, cached)
	for range 1000 { // cleanups run after a collection, on their own goroutine
		runtime.GC()
		if _, cached = protocolFragments.Load(k); !cached {
			return
		}
		runtime.Gosched()
	}
	t.Fatal("the fragment of a collected client is still cached")
}

// BenchmarkToolCallParams is the params of a forwarded tools/call with a progress token,
// written directly (what forwarding does) and through json.Marshal (what it did before).
func BenchmarkToolCallParams(b *testing.B) {
	cli := unstartedClient(b)
	p := mcp.CallToolParams{Name: "echo", RawArguments: json.RawMessage(`{"message":"hello 42"}`),
		Arguments: map[string]any{"message": "hello 42"}, Meta: &mcp.Meta{ProgressToken: "sg-1"}}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _, _ = toolCallParams(cli, mcp.ProtocolVersion20260728, p)
		}
	})
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			q := p
			q.Meta = protocolMeta(cli, mcp.ProtocolVersion20260728, p.Meta)
			_, _ = json.Marshal(q)
		}
	})
}
