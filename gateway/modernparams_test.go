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

// TestRelayedParamsAreTheSandboxsWithTheHopsFields: what a 2026-07-28 upstream gets is the
// sandbox's params as written (arguments byte for byte, the name the upstream's own), its _meta
// without the sandbox's protocol keys and with Sandgate's progress token and the upstream hop's
// protocol fields, and the standard headers of what is sent.
func TestRelayedParamsAreTheSandboxsWithTheHopsFields(t *testing.T) {
	cli := unstartedClient(t)
	x := &exchange{name: "echo", modern: true}
	var err error
	x.msg, err = readMessage([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"up_echo",` +
		`"arguments":{"n":9007199254740993,"b":"\u00e9"},"_meta":{"progressToken":"p","io.modelcontextprotocol/protocolVersion":"2026-07-28","trace":"t"}}}`))
	require.NoError(t, err)
	p := x.relayParams()
	p.token = "sg-9"
	raw, h, err := p.modern(cli, mcp.ProtocolVersion20260728, "tools/call")
	require.NoError(t, err)
	require.True(t, json.Valid(raw), "%s", raw)
	assert.Contains(t, string(raw), `"arguments":{"n":9007199254740993,"b":"\u00e9"}`, "the arguments as written")
	var got struct {
		Name string         `json:"name"`
		Meta map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Equal(t, "echo", got.Name)
	assert.Equal(t, "sg-9", got.Meta["progressToken"])
	assert.Equal(t, "t", got.Meta["trace"])
	assert.Equal(t, "2026-07-28", got.Meta[mcp.MetaKeyProtocolVersion])
	assert.Equal(t, "sandgate", got.Meta[mcp.MetaKeyClientInfo].(map[string]any)["name"])
	assert.Equal(t, "tools/call", h.Get(mcp.HeaderMethod))
	assert.Equal(t, "echo", h.Get(mcp.HeaderName))
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

// BenchmarkRelayParams is the params of a forwarded tools/call with a progress token, for a
// 2026-07-28 upstream: the sandbox's bytes with the hop's fields.
func BenchmarkRelayParams(b *testing.B) {
	cli := unstartedClient(b)
	x := &exchange{name: "echo", modern: true}
	x.msg, _ = readMessage([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello 42"},"_meta":{"progressToken":7}}}`))
	b.ReportAllocs()
	for b.Loop() {
		p := x.relayParams()
		p.token = "sg-1"
		_, _, _ = p.modern(cli, mcp.ProtocolVersion20260728, "tools/call")
	}
}
