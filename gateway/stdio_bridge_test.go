package gateway

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// samplingClient answers sampling/createMessage with a fixed text and counts the requests.
type samplingClient struct {
	answer string
	calls  atomic.Int32
}

func (s *samplingClient) CreateMessage(_ context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	s.calls.Add(1)
	return &mcp.CreateMessageResult{
		SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent(s.answer)},
		Model:           "sandbox-model",
	}, nil
}

// connectSamplingSandbox connects a sandbox that answers sampling. mcp-go's client receives
// server-to-client requests on its GET stream, hence continuous listening.
func connectSamplingSandbox(t *testing.T, url, src string, sampler *samplingClient) *client.Client {
	t.Helper()
	//lint:ignore SA1019 a legacy sandbox receives server-initiated requests on the GET stream
	tr, err := transport.NewStreamableHTTP(url, transport.WithHTTPBasicClient(sandboxHTTPClient(src, nil)), transport.WithContinuousListening())
	require.NoError(t, err)
	c := client.NewClient(tr, client.WithProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION), client.WithSamplingHandler(sampler))
	require.NoError(t, c.Start(t.Context()))
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "sandbox-" + src, Version: "1"}
	init.Params.Capabilities.Sampling = &mcp.SamplingCapability{}
	_, err = c.Initialize(t.Context(), init)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// A stdio upstream asks for sampling during a call: the request has no HTTP stream to ride on,
// so it is matched to the one call in flight on that upstream and reaches that call's sandbox,
// and no other.
func TestStdioUpstreamSamplingReachesTheCallingSandbox(t *testing.T) {
	bin := buildExampleUpstream(t)
	// The example asks with a server-initiated request, which 2026-07-28 removed: an upstream
	// like it is pinned to the legacy revision.
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "local", Command: bin, Args: []string{"-sampling"},
		ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION})
	h.waitReady(t)

	caller := &samplingClient{answer: "forty-two"}
	bystander := &samplingClient{answer: "wrong sandbox"}
	c := connectSamplingSandbox(t, h.URL(), "127.0.0.2", caller)
	_ = connectSamplingSandbox(t, h.URL(), "127.0.0.1", bystander)

	res, err := callTool(t, c, "ask-model", map[string]any{"question": "what is six times seven?"})
	require.NoError(t, err)
	assert.False(t, res.IsError, resultText(res))
	assert.Equal(t, "model says: forty-two", resultText(res))
	assert.EqualValues(t, 1, caller.calls.Load())
	assert.EqualValues(t, 0, bystander.calls.Load())
}

// A sandbox on the newest protocol revision (2026-07-28: no initialize, protocol version and
// capabilities in every request's _meta) calls a tool of an HTTP upstream that Sandgate speaks
// to on an older revision: the sandbox's protocol _meta stays on its own hop.
func TestNewestProtocolSandboxReachesOlderUpstream(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)
	tr, err := transport.NewStreamableHTTP(h.URL(), transport.WithHTTPBasicClient(sandboxHTTPClient("127.0.0.2", nil)))
	require.NoError(t, err)
	c := client.NewClient(tr)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ClientInfo = mcp.Implementation{Name: "sandbox-newest", Version: "1"}
	_, err = c.Initialize(t.Context(), init)
	require.NoError(t, err)

	res, err := callTool(t, c, "echo", map[string]any{"message": "hello from the newest revision"})
	require.NoError(t, err)
	assert.False(t, res.IsError, resultText(res))
	assert.Equal(t, "hello from the newest revision", resultText(res))
}

func TestHopMetaDropsProtocolKeysAndTheProgressToken(t *testing.T) {
	got := hopMeta([]byte(`{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},` +
		`"io.modelcontextprotocol/clientInfo":{"name":"x"},"com.example/trace":"abc","progressToken":7}`))
	assert.Equal(t, `"com.example/trace":"abc"`, string(got))
	assert.Empty(t, hopMeta([]byte(`{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}`)))
}
