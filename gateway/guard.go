package gateway

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
)

// JSON-RPC error codes the guard answers with.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeInvalidParams  = -32602
	codeResourceGone   = -32002 // MCP's resource-not-found before protocol 2026-07-28
	codeInternalError  = -32603
)

// guard is where every sandbox request to /mcp begins: it refuses, before any call exists, a
// request whose Host or Origin is foreign (403 bad_host, bad_origin: DNS-rebinding protection)
// or whose caller is not a known sandbox (403 unknown_caller: no session, no serverInfo, no
// capabilities), each a rate-limited mcp.rejected event; everything else is one call
// (relay.go), whatever happens to it. Identity is resolved here from the TCP peer address only;
// no header is read for it.
type guard struct {
	g       *Gateway
	hosts   map[string]bool
	origins map[string]bool
}

func newGuard(g *Gateway) *guard {
	gd := &guard{g: g, hosts: map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true},
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
	id := identity.FromRemoteAddr(gd.g.opts.Identity, r.RemoteAddr)
	var rf *call.Refusal
	switch {
	case !gd.hostAllowed(r.Host):
		rf = call.Refuse(call.CodeBadHost, "Host header not allowed")
	case r.Header.Get("Origin") != "" && !gd.originAllowed(r.Header.Get("Origin")):
		rf = call.Refuse(call.CodeBadOrigin, "Origin not allowed")
	case !id.Known:
		rf = call.Refuse(call.CodeUnknownCaller, "caller is not a known sandbox")
	}
	if rf != nil {
		rf = gd.g.core.Reject(r.Context(), audit.KindMCPRejected, id, audit.Target{Method: r.Method}, rf)
		writeRPCError(w, rf.Status(), nil, codeInvalidRequest, rf)
		return
	}
	gd.g.serveExchange(w, r, id)
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

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// writeRPCError answers with a JSON-RPC error object (id null unless the request's id is known).
// The refusal's own headers (Retry-After) go with it, and its code in the error's data, as the
// proxy puts it in its error body: the code the event has, for a client to branch on.
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, rf *call.Refusal) {
	rf.SetHeaders(w.Header())
	writeRPC(w, status, id, rpcError{Code: rpcCode(code, rf), Message: rf.Reason, Data: refusalData{Code: rf.Code}})
}

// rpcCode is the JSON-RPC error code of a refusal: code, but internal error for the refusal
// that takes any other's place while the audit log cannot take an event (call.Core.Reject).
func rpcCode(code int, rf *call.Refusal) int {
	if rf.Code == call.CodeAuditUnavailable {
		return codeInternalError
	}
	return code
}

// refusalData is the data of a JSON-RPC error that answers a refusal.
type refusalData struct {
	Code string `json:"code"`
}

func writeRPC(w http.ResponseWriter, status int, id json.RawMessage, e rpcError) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(rpcErrorBody(id, e))
}

// rpcErrorBody is a JSON-RPC error response (id null unless id is a valid JSON value).
func rpcErrorBody(id json.RawMessage, e rpcError) []byte {
	if len(id) == 0 || !json.Valid(id) {
		id = json.RawMessage("null")
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: e})
	return body
}
