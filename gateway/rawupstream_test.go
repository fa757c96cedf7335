package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/sse"
)

// rawUpstream is a hand-written Streamable HTTP MCP server (legacy protocol, JSON responses;
// 2026-07-28 too when modern is set) that answers the lists from a fixture exactly as written
// there, and records every message it receives. It stands for upstreams whose objects carry
// more than mcp-go models.
type rawUpstream struct {
	srv      *httptest.Server
	catalog  map[string]json.RawMessage
	mu       sync.Mutex
	modern   bool // answers server/discover: speaks 2026-07-28
	got      []rpcEnvelope
	sessions int             // sessions initialized
	deleted  []string        // sessions ended with DELETE
	polled   json.RawMessage // the request whose stream "poll" ended, until resumed
	resumes  []string        // Last-Event-ID of every resuming GET
}

type rpcEnvelope struct {
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Session string          `json:"-"` // the Mcp-Session-Id it came with
	Header  http.Header     `json:"-"` // the HTTP headers it came with
}

func startRawUpstream(t testing.TB, fixture string) *rawUpstream {
	t.Helper()
	b, err := os.ReadFile(fixture)
	require.NoError(t, err)
	u := &rawUpstream{}
	require.NoError(t, json.Unmarshal(b, &u.catalog))
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *rawUpstream) URL() string { return u.srv.URL + "/mcp" }

// received is every message the upstream received with the given method.
func (u *rawUpstream) received(method string) []rpcEnvelope {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []rpcEnvelope
	for _, m := range u.got {
		if m.Method == method {
			out = append(out, m)
		}
	}
	return out
}

func (u *rawUpstream) ended() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.deleted...)
}

func (u *rawUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodDelete {
		u.mu.Lock()
		u.deleted = append(u.deleted, r.Header.Get("Mcp-Session-Id"))
		u.mu.Unlock()
		return
	}
	if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") == "" {
		w.WriteHeader(http.StatusMethodNotAllowed) // no listening stream
		return
	}
	if r.Method == http.MethodGet {
		u.resume(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var m rpcEnvelope
	body, _ := io.ReadAll(r.Body)
	if json.Unmarshal(body, &m) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	m.Session, m.Header = r.Header.Get("Mcp-Session-Id"), r.Header.Clone()
	u.mu.Lock()
	u.got = append(u.got, m)
	modern := u.modern
	if m.Method == "initialize" {
		u.sessions++
		w.Header().Set("Mcp-Session-Id", fmt.Sprint("raw-session-", u.sessions))
	}
	u.mu.Unlock()
	if len(m.ID) == 0 {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	var result any
	switch m.Method {
	case "initialize":
		result = map[string]any{"protocolVersion": "2025-06-18", "serverInfo": map[string]any{"name": "raw", "version": "1"},
			"capabilities": map[string]any{"tools": map[string]any{}, "resources": map[string]any{}, "prompts": map[string]any{}}}
	case "server/discover":
		if !modern {
			writeJSON(w, map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
			return
		}
		result = json.RawMessage(modernDiscover)
	case "tools/call":
		var p struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(m.Params, &p)
		if p.Name == "ask-model" {
			result = askModel(m.Params)
			break
		}
		if p.Name == "poll" { // SEP-1699: end the stream before the result; the client resumes
			u.mu.Lock()
			u.polled = m.ID
			u.mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "id: ev-1\nretry: 10\ndata: \n\n")
			return
		}
		if p.Name == "slow" {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
		result = json.RawMessage(richResult)
		if modern { // a 2026-07-28 server names itself in each result's _meta
			result = json.RawMessage(strings.Replace(richResult, `"_meta":{"com.example/trace":"t-1"}`,
				`"_meta":{"com.example/trace":"t-1","io.modelcontextprotocol/serverInfo":{"name":"raw","version":"1"}}`, 1))
		}
	case "resources/read":
		result = json.RawMessage(richRead)
	case "prompts/get":
		result = json.RawMessage(richPrompt)
	default:
		if c, ok := u.catalog[m.Method]; ok && modern { // a 2026-07-28 list says how long it may be cached
			result, _ = jsonenc.WithMember(c, "ttlMs", []byte("60000"))
			result, _ = jsonenc.WithMember(result.(json.RawMessage), "cacheScope", []byte(`"public"`))
		} else if ok {
			result = c
		} else if m.Method == "ping" || m.Method == "logging/setLevel" {
			result = map[string]any{}
		} else {
			writeJSON(w, map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
			return
		}
	}
	if tok := progressTokenOf(m.Params); tok != nil {
		// A request with a progress token gets a progress notification, then its result, on
		// an SSE stream; tool "bare" a log message before it.
		n, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/progress",
			"params": map[string]any{"progressToken": tok, "progress": 1, "total": 2}})
		res, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": result})
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(string(m.Params), `"name":"bare"`) { // "bare": a log message first
			_, _ = fmt.Fprintf(w, "data: %s\n\n", `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"first"}}`)
			w.(http.Flusher).Flush()
		}
		_, _ = fmt.Fprintf(w, "data: %s\n\ndata: %s\n\n", n, res)
		return
	}
	writeJSON(w, map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": result})
}

// enveloped is msg, a request or notification, with 2026-07-28's per-request fields in its
// params' _meta.
func (s *rawSession) enveloped(msg any) any {
	m, ok := msg.(map[string]any)
	if !ok || m["method"] == nil {
		return msg
	}
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	p := map[string]any{}
	if given, ok := m["params"].(map[string]any); ok {
		for k, v := range given {
			p[k] = v
		}
	}
	meta := map[string]any{}
	if given, ok := p["_meta"].(map[string]any); ok {
		for k, v := range given {
			meta[k] = v
		}
	}
	meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
	meta["io.modelcontextprotocol/clientCapabilities"] = s.caps
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "raw", "version": "1"}
	p["_meta"] = meta
	out["params"] = p
	return out
}

func progressTokenOf(params json.RawMessage) any {
	var p struct {
		Meta struct {
			ProgressToken any `json:"progressToken"`
		} `json:"_meta"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Meta.ProgressToken
}

// resume answers a GET with Last-Event-ID ev-1 with the result of the polled request.
func (u *rawUpstream) resume(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	id := u.polled
	u.resumes = append(u.resumes, r.Header.Get("Last-Event-ID"))
	u.mu.Unlock()
	if r.Header.Get("Last-Event-ID") != "ev-1" || id == nil {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
		"result": map[string]any{"content": []any{map[string]any{"type": "text", "text": "resumed"}}}})
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = fmt.Fprintf(w, "id: ev-2\ndata: %s\n\n", b)
}

// richResult is every tools/call result of rawUpstream: content items with annotations and _meta,
// a content type no revision defines, structuredContent, the result's _meta and a top-level
// field no revision defines.
const richResult = `{"content":[{"type":"text","text":"ok","annotations":{"audience":["user"],"priority":1},"_meta":{"k":"v"}},` +
	`{"type":"image","data":"aGk=","mimeType":"image/png"},{"type":"hologram","frames":[1,2]}],` +
	`"structuredContent":{"echoed":"ok","n":[1,2.5,null]},"_meta":{"com.example/trace":"t-1"},"x-future":{"kept":[1,"a"]}}`

// richRead and richPrompt are rawUpstream's resources/read and prompts/get results, each with
// top-level fields mcp-go's typed results do not carry.
const (
	richRead = `{"contents":[{"uri":"note://rich/readme","mimeType":"text/markdown","text":"# hi","_meta":{"etag":"abc"},` +
		`"annotations":{"audience":["user"]}},{"uri":"note://rich/readme#2","blob":"aGk=","mimeType":"application/octet-stream"}],` +
		`"_meta":{"com.example/etag":"r1"},"x-future":true}`
	richPrompt = `{"description":"d","messages":[{"role":"user","content":{"type":"text","text":"hi","_meta":{"k":1}}},` +
		`{"role":"assistant","content":{"type":"resource_link","uri":"note://rich/readme","name":"readme","icons":[{"src":"https://example.com/i.png"}]}}],"x-future":"p"}`
)

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// rawSession is a sandbox speaking plain JSON-RPC over Streamable HTTP, so that the test sees
// every byte of the results, not what a typed client keeps of them.
type rawSession struct {
	t   testing.TB
	url string
	hc  *http.Client
	sid string
	id  int
	// modern is a sandbox of 2026-07-28: no session, the protocol's fields in each request's
	// _meta (caps its client capabilities) and the standard headers.
	modern bool
	caps   map[string]any
}

// openModernSession is a raw sandbox of 2026-07-28, whose client declares caps.
func openModernSession(t testing.TB, url, src string, caps map[string]any) *rawSession {
	if caps == nil {
		caps = map[string]any{}
	}
	return &rawSession{t: t, url: url, hc: sandboxHTTPClient(src, nil), modern: true, caps: caps}
}

func openRawSession(t testing.TB, url, src string) *rawSession {
	t.Helper()
	s := &rawSession{t: t, url: url, hc: sandboxHTTPClient(src, nil)}
	s.call("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	s.post(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"}).Body.Close()
	return s
}

// call sends one request and returns its result, read from a JSON or an SSE response.
func (s *rawSession) call(method string, params any) json.RawMessage {
	s.t.Helper()
	res, _ := s.callStream(method, params)
	return res
}

// callStream is call that also returns every message of the response before the result.
func (s *rawSession) callStream(method string, params any) (json.RawMessage, []rpcNotification) {
	s.t.Helper()
	res, rpcErr, notes := s.exchange(method, params)
	require.Nil(s.t, rpcErr, "%s answered an error: %s", method, rpcErr)
	return res, notes
}

// exchange sends one request and returns its result or its JSON-RPC error, and the
// notifications before it.
func (s *rawSession) exchange(method string, params any) (json.RawMessage, json.RawMessage, []rpcNotification) {
	s.t.Helper()
	s.id++
	resp := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": method, "params": params})
	defer resp.Body.Close()
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		s.sid = sid
	}
	var msgs [][]byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		rd := sse.NewReader(resp.Body, 4<<20)
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			msgs = append(msgs, bytes.Clone(ev.Data))
		}
	} else {
		b, err := io.ReadAll(resp.Body)
		require.NoError(s.t, err)
		msgs = append(msgs, b)
	}
	var before []rpcNotification
	for _, b := range msgs {
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
			rpcNotification
		}
		if json.Unmarshal(b, &m) == nil && m.ID == s.id {
			return m.Result, m.Error, before
		}
		if m.Method != "" {
			before = append(before, m.rpcNotification)
		}
	}
	s.t.Fatalf("%s: no response in %q", method, msgs)
	return nil, nil, nil
}

type rpcNotification struct {
	Method string         `json:"method"`
	Params map[string]any `json:"params"`
}

func (s *rawSession) post(msg any) *http.Response {
	s.t.Helper()
	return s.postWith(msg, nil)
}

// postWith posts msg with the headers of its revision, then those of h.
func (s *rawSession) postWith(msg any, h http.Header) *http.Response {
	s.t.Helper()
	if s.modern {
		msg = s.enveloped(msg)
	}
	b, _ := json.Marshal(msg)
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodPost, s.url, bytes.NewReader(b))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if s.modern {
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		if m, ok := msg.(map[string]any); ok {
			if method, _ := m["method"].(string); method != "" && m["id"] != nil {
				req.Header.Set("Mcp-Method", method)
				p, _ := m["params"].(map[string]any)
				for _, k := range []string{"name", "uri"} {
					if v, ok := p[k].(string); ok && method != "completion/complete" {
						req.Header.Set("Mcp-Name", v)
					}
				}
			}
		}
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if s.sid != "" {
		req.Header.Set("Mcp-Session-Id", s.sid)
	}
	resp, err := s.hc.Do(req)
	require.NoError(s.t, err)
	return resp
}
