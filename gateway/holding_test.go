package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// holdingUpstream is a hand-written Streamable HTTP MCP server (JSON responses) whose tools hand
// back the credential Sandgate sent it in the shapes issue 59 found unguarded: in pieces across
// a result's strings, as wrapped base64, in a body whose codings are sent as two header lines,
// and inside an HTTP answer Go's transport cannot read (its error quoting the upstream).
type holdingUpstream struct{ srv *httptest.Server }

var holdingTools = []string{"parts", "lines", "wrapped", "coded", "broken-status", "broken-header"}

func startHoldingUpstream(t *testing.T) *holdingUpstream {
	u := &holdingUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *holdingUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"params"`
	}
	body, _ := io.ReadAll(r.Body)
	if json.Unmarshal(body, &m) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if len(m.ID) == 0 {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	var result any
	switch m.Method {
	case "initialize":
		w.Header().Set("Mcp-Session-Id", "holding-1")
		result = map[string]any{"protocolVersion": "2025-06-18", "serverInfo": map[string]any{"name": "holding", "version": "1"},
			"capabilities": map[string]any{"tools": map[string]any{}}}
	case "tools/list":
		var tools []any
		for _, n := range holdingTools {
			tools = append(tools, map[string]any{"name": n, "inputSchema": map[string]any{"type": "object"}})
		}
		result = map[string]any{"tools": tools}
	case "tools/call":
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if u.raw(w, m.Params.Name, key) {
			return
		}
		result = holdingResult(m.Params.Name, m.Params.Arguments, key)
	default:
		result = map[string]any{}
	}
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": result})
	if m.Method == "tools/call" && m.Params.Name == "coded" {
		// The codings as two header lines, in the order applied: Go's transport, asked for
		// gzip by itself, decoded the first and dropped both (issue 59, class 1).
		enc, _ := respguardtest.Encode(msg, "gzip", "gzip")
		w.Header()["Content-Encoding"] = []string{"gzip", "gzip"}
		msg = enc
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(msg)
}

// raw answers the tools whose answer is no valid HTTP, written on the connection itself.
func (u *holdingUpstream) raw(w http.ResponseWriter, tool, key string) bool {
	var answer string
	switch tool {
	case "broken-status":
		answer = "HTTP/1.1 canary-" + key + " OK\r\nContent-Length: 0\r\n\r\n"
	case "broken-header":
		answer = "HTTP/1.1 200 OK\r\ncanary-" + key + "\r\nContent-Length: 0\r\n\r\n"
	default:
		return false
	}
	c, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return true
	}
	defer c.Close()
	_, _ = io.WriteString(c, answer)
	return true
}

// cuts are where a key is split into the pieces of one result.
func cuts(args map[string]any, key string) []string {
	var at []int
	if a, ok := args["at"].([]any); ok {
		for _, v := range a {
			at = append(at, int(v.(float64)))
		}
	}
	var p []string
	from := 0
	for _, c := range at {
		p = append(p, key[from:c])
		from = c
	}
	return append(p, key[from:])
}

func holdingResult(tool string, args map[string]any, key string) any {
	switch tool {
	case "parts":
		var content []any
		for _, p := range cuts(args, key) {
			content = append(content, map[string]any{"type": "text", "text": p})
		}
		return map[string]any{"content": content}
	case "lines":
		return map[string]any{"content": []any{map[string]any{"type": "text", "text": "see structuredContent"}},
			"structuredContent": map[string]any{"lines": cuts(args, key)}}
	case "wrapped":
		width, eol := int(args["width"].(float64)), args["eol"].(string)
		b64 := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("p", int(args["offset"].(float64))) + key + strings.Repeat("q", 40)))
		var pem strings.Builder
		pem.WriteString("-----BEGIN TOKEN-----" + eol)
		for len(b64) > width {
			pem.WriteString(b64[:width] + eol)
			b64 = b64[width:]
		}
		pem.WriteString(b64 + eol + "-----END TOKEN-----" + eol)
		return map[string]any{"content": []any{map[string]any{"type": "text", "text": pem.String()}}}
	}
	return map[string]any{"content": []any{map[string]any{"type": "text", "text": "you sent " + key}}}
}

// sandboxText is what a sandbox joining a tool result's strings reads: every text part, and
// the lines of its structured content, joined.
func sandboxText(t *testing.T, res json.RawMessage) string {
	t.Helper()
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		StructuredContent struct {
			Lines []string `json:"lines"`
		} `json:"structuredContent"`
	}
	require.NoError(t, json.Unmarshal(res, &r), "%s", res)
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	b.WriteString(strings.Join(r.StructuredContent.Lines, ""))
	return b.String()
}

// TestHeldOnTheMCPHalf (issue 59, classes 1 to 4 on the gateway): an upstream that hands back its
// credential in pieces of one result (text content parts, an array of strings), as base64
// wrapped at MIME's and PEM's widths, in a body whose codings come as two header lines, or in
// an answer Go's transport cannot read hands the sandbox none of it; the words of the broken
// answer are the event's only, scrubbed there.
func TestHeldOnTheMCPHalf(t *testing.T) {
	up := startHoldingUpstream(t)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.srv.URL + "/mcp",
		ProtocolVersion: "2025-06-18", MaxMessageBytes: 1 << 20,
		Credential: &config.CredentialRef{Name: "upstream", Header: "Authorization", Format: "Bearer {value}"}})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	needles := respguard.Build([]string{upstreamSecret}, nil)
	call := func(t *testing.T, tool string, args map[string]any) json.RawMessage {
		res := s.call("tools/call", map[string]any{"name": tool, "arguments": args})
		assert.False(t, needles.Betrays(res), "%s", res)
		return res
	}
	for _, at := range [][]any{{1}, {4}, {16}, {len(upstreamSecret) - 1}, {5, 17}, {3, 9, 15, 21, 27}} {
		for _, tool := range []string{"parts", "lines"} {
			t.Run(fmt.Sprintf("%s split at %v", tool, at), func(t *testing.T) {
				text := sandboxText(t, call(t, tool, map[string]any{"at": at}))
				assert.NotContains(t, text, upstreamSecret[3:], "a sandbox joining the pieces learns at most the first bytes")
			})
		}
	}
	for _, width := range []float64{76, 64} {
		for _, eol := range []string{"\r\n", "\n"} {
			for _, offset := range []float64{0, 1, 2, 40, 45} {
				t.Run(fmt.Sprintf("base64 wrapped at %v, %q, key at %v", width, eol, offset), func(t *testing.T) {
					text := sandboxText(t, call(t, "wrapped", map[string]any{"width": width, "eol": eol, "offset": offset}))
					unwrapped := strings.NewReplacer("\r", "", "\n", "").Replace(text)
					assert.False(t, needles.Betrays([]byte(unwrapped)), "the sandbox's base64 decoder skips the breaks: %q", text)
				})
			}
		}
	}
	t.Run("codings as two header lines", func(t *testing.T) {
		text := sandboxText(t, call(t, "coded", nil))
		assert.Contains(t, text, respguard.Marker[:8], "decoded, every layer, and scrubbed: %q", text)
	})
	for _, tool := range []string{"broken-status", "broken-header"} {
		t.Run(tool+": Sandgate's words only", func(t *testing.T) {
			res := call(t, tool, nil)
			assert.NotContains(t, strings.ToLower(string(res)), "canary", "%s", res)
			assert.Contains(t, string(res), "upstream_error")
		})
	}
	var broken int
	for _, ev := range h.auditEvents(t) {
		b, _ := json.Marshal(ev)
		assert.NotContains(t, string(b), upstreamSecret, "no event holds the credential")
		if ev.Kind == audit.KindToolsCall && strings.HasPrefix(ev.Target.Tool, "broken-") {
			broken++
			assert.Equal(t, "upstream_error", ev.Outcome.Error)
			assert.Contains(t, ev.Outcome.Detail, "canary-", "the event keeps what failed")
			assert.True(t, ev.Outcome.CredentialEchoed, "the upstream sent the key back, in its broken answer")
		}
	}
	assert.Equal(t, 2, broken)
}
