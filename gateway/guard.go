package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/internal/identity"
)

// JSON-RPC error codes the guard answers with.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
)

// guard checks every request before mcp-go sees it. It refuses, each time with an HTTP status
// and a JSON-RPC error body, and never with a crash or a hang:
//   - a Host header whose host is not localhost, 127.0.0.1, ::1 or a configured allowed host
//     (403, DNS-rebinding protection);
//   - an Origin header that is neither a configured allowed origin nor one whose host is
//     allowed as above (403);
//   - a POST whose Content-Type is not application/json (415);
//   - a POST body larger than max_body_bytes (413);
//   - a body that is not JSON (400, parse error) or is a JSON array: batches are not part of
//     the protocol revisions served (400, invalid request);
//   - a request without Mcp-Session-Id other than initialize (400), or with a session ID that
//     is unknown, expired, or was created by another source address (404: a session cannot be
//     used from another sandbox).
//
// Identity is resolved later from the TCP peer address only; no header is read for it.
type guard struct {
	g       *Gateway
	hosts   map[string]bool
	origins map[string]bool
	next    http.Handler
}

func newGuard(g *Gateway) *guard {
	gd := &guard{g: g, next: g.http, hosts: map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true},
		origins: map[string]bool{}}
	for _, h := range g.opts.Config.AllowedHosts {
		gd.hosts[strings.ToLower(strings.Trim(h, "[]"))] = true
	}
	for _, o := range g.opts.Config.AllowedOrigins {
		gd.origins[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	return gd
}

func (gd *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !gd.hostAllowed(r.Host) {
		writeRPCError(w, http.StatusForbidden, nil, codeInvalidRequest, "Host header not allowed")
		return
	}
	if o := r.Header.Get("Origin"); o != "" && !gd.originAllowed(o) {
		writeRPCError(w, http.StatusForbidden, nil, codeInvalidRequest, "Origin not allowed")
		return
	}
	var method string
	var id json.RawMessage
	if r.Method == http.MethodPost {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			writeRPCError(w, http.StatusUnsupportedMediaType, nil, codeInvalidRequest, "Content-Type must be application/json")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, gd.g.opts.Config.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeRPCError(w, http.StatusRequestEntityTooLarge, nil, codeInvalidRequest, "request body too large")
				return
			}
			writeRPCError(w, http.StatusBadRequest, nil, codeParseError, "could not read the request body")
			return
		}
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		if len(trimmed) > 0 && trimmed[0] == '[' {
			writeRPCError(w, http.StatusBadRequest, nil, codeInvalidRequest, "batch requests are not supported")
			return
		}
		var msg struct {
			Method string          `json:"method"`
			ID     json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(trimmed, &msg); err != nil {
			writeRPCError(w, http.StatusBadRequest, nil, codeParseError, "parse error: body is not a JSON-RPC message object")
			return
		}
		method, id = msg.Method, msg.ID
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	sid := r.Header.Get(server.HeaderKeySessionID)
	switch {
	case sid != "":
		peer, _ := identity.ParsePeer(r.RemoteAddr)
		if !gd.g.sessions.valid(r.Context(), sid, peer) {
			writeRPCError(w, http.StatusNotFound, id, codeInvalidRequest, "session not found or expired; send initialize to start a new session")
			return
		}
	case r.Method == http.MethodPost && method != string(mcp.MethodInitialize) && !modernRequest(r):
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidRequest, "Mcp-Session-Id header is required after initialize")
		return
	case r.Method == http.MethodDelete:
		writeRPCError(w, http.StatusBadRequest, nil, codeInvalidRequest, "Mcp-Session-Id header is required")
		return
	}
	gd.next.ServeHTTP(w, r)
}

// modernRequest reports a request of a session-less protocol revision (2026-07-28 and later),
// which carries no session ID by design.
func modernRequest(r *http.Request) bool {
	v := r.Header.Get(mcp.HeaderProtocolVersion)
	return v != "" && v >= mcp.ProtocolVersion20260728
}

func (gd *guard) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return gd.hosts[strings.ToLower(strings.Trim(host, "[]"))]
}

func (gd *guard) originAllowed(origin string) bool {
	if gd.origins[strings.ToLower(strings.TrimSuffix(origin, "/"))] {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return gd.hostAllowed(u.Host)
}

// writeRPCError answers with a JSON-RPC error object (id null unless the request's id is known).
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	if len(id) == 0 || !json.Valid(id) {
		id = json.RawMessage("null")
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
