package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

type rpcReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func post(t *testing.T, c *http.Client, url, body string, hdr map[string]string) (*http.Response, rpcReply) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var r rpcReply
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b = lastEventData(b)
	}
	if len(b) > 0 {
		require.NoError(t, json.Unmarshal(b, &r), "body is JSON-RPC: %s", b)
	}
	return resp, r
}

func TestBadInputGetsAJSONRPCErrorAndSandgateKeepsServing(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)
	c := sandboxHTTPClient("127.0.0.2", nil)
	other := sandboxHTTPClient("127.0.0.3", nil)
	resp, _ := post(t, c, h.URL(), initBody, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sid := resp.Header.Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)
	post(t, c, h.URL(), `{"jsonrpc":"2.0","method":"notifications/initialized"}`, map[string]string{"Mcp-Session-Id": sid})
	withSession := map[string]string{"Mcp-Session-Id": sid}

	tests := []struct {
		name   string
		client *http.Client
		body   string
		hdr    map[string]string
		status int
		code   int
	}{
		{"malformed JSON is a parse error", c, `{"jsonrpc":"2.0",`, withSession, 400, -32700},
		{"wrong content type is refused", c, initBody, map[string]string{"Content-Type": "text/plain"}, 415, -32600},
		{"huge body is refused", c, `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", 70<<10) + `"}}`, withSession, 413, -32600},
		{"unknown method is method not found", c, `{"jsonrpc":"2.0","id":7,"method":"no/such/method"}`, withSession, 200, -32601},
		{"foreign Origin is refused", c, initBody, map[string]string{"Origin": "http://evil.example.com"}, 403, -32600},
		{"foreign Host is refused", c, initBody, map[string]string{"Host": "evil.example.com"}, 403, -32600},
		{"batch array is refused", c, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, withSession, 400, -32600},
		{"missing session id is refused", c, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, nil, 400, -32600},
		{"unknown session id is not found", c, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, map[string]string{"Mcp-Session-Id": "deadbeef"}, 404, -32600},
		{"session id from another sandbox is not found", other, `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`, withSession, 404, -32600},
		{"JSON that is not an object is a parse error", c, `"hello"`, withSession, 400, -32700},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := tt.hdr
			if host, ok := hdr["Host"]; ok {
				req, _ := http.NewRequest(http.MethodPost, h.URL(), strings.NewReader(tt.body))
				req.Host = host
				req.Header.Set("Content-Type", "application/json")
				resp, err := tt.client.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, tt.status, resp.StatusCode)
				return
			}
			resp, r := post(t, tt.client, h.URL(), tt.body, hdr)
			assert.Equal(t, tt.status, resp.StatusCode)
			require.NotNil(t, r.Error, "a JSON-RPC error")
			assert.Equal(t, tt.code, r.Error.Code)
		})
	}
	// Still serving the session after all of that.
	resp, r := post(t, c, h.URL(), `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`, withSession)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Nil(t, r.Error)
	assert.Contains(t, string(r.Result), "echo")
}
