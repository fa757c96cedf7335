package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/mediatype"
)

// JSON-RPC error codes the guard answers with.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeInvalidParams  = -32602
	codeResourceGone   = -32002 // MCP's resource-not-found before protocol 2026-07-28
	codeInternalError  = -32603
)

// guard is where every sandbox request to /mcp begins its call (internal/call): exactly one
// audit event per HTTP request, whatever happens to it. It refuses, each time with an HTTP
// status from call's refusal table, a JSON-RPC error body and a rate-limited mcp.rejected
// event, and never with a crash or a hang:
//   - a Host header whose host is not localhost, 127.0.0.1, ::1 or a configured allowed host
//     (403 bad_host, DNS-rebinding protection);
//   - an Origin header that is neither a configured allowed origin nor one whose host is
//     allowed as above (403 bad_origin);
//   - a caller whose address maps to no known sandbox (403 unknown_caller): no session, no
//     serverInfo, no capabilities;
//   - a POST whose Content-Type is not application/json (415 unsupported_media_type);
//   - a POST body larger than max_body_bytes (413 body_too_large), or sent slower than
//     body_timeout and min_body_rate allow (408 body_timeout);
//   - a body that is not a JSON object (400 malformed_request) or is a JSON array: batches are
//     not part of the protocol revisions served (400 batch_refused);
//   - a message that JSON readers read differently, or a tools/call whose arguments are not
//     an object (400 bad_params, JSON-RPC invalid params, the request's own event: params.go);
//   - a request without Mcp-Session-Id other than initialize (400 session_required), or with
//     a session ID that is unknown or expired (404 not_found) or was created by another source
//     address (404 session_not_owned: the same answer, so nothing tells the ID exists);
//   - an initialize over the caller's or the replica's session cap (429 session_limit).
//
// Identity is resolved here from the TCP peer address only; no header is read for it.
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

// rpcMessage is what the guard reads of a JSON-RPC message.
type rpcMessage struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
	Params struct {
		URI string `json:"uri"`
	} `json:"params"`
}

func (gd *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := identity.FromRemoteAddr(gd.g.opts.Identity, r.RemoteAddr)
	reject := func(rpcID json.RawMessage, rpcCode int, rf *call.Refusal) {
		rf = gd.g.core.Reject(r.Context(), audit.KindMCPRejected, id, audit.Target{Method: r.Method}, rf)
		writeRPCError(w, rf.Status(), rpcID, rpcCode, rf)
	}
	if !gd.hostAllowed(r.Host) {
		reject(nil, codeInvalidRequest, call.Refuse(call.CodeBadHost, "Host header not allowed"))
		return
	}
	if o := r.Header.Get("Origin"); o != "" && !gd.originAllowed(o) {
		reject(nil, codeInvalidRequest, call.Refuse(call.CodeBadOrigin, "Origin not allowed"))
		return
	}
	if !id.Known {
		reject(nil, codeInvalidRequest, call.Refuse(call.CodeUnknownCaller, "caller is not a known sandbox"))
		return
	}
	var msg rpcMessage
	var body []byte
	if r.Method == http.MethodPost {
		var rf *call.Refusal
		var rpcCode int
		if body, msg, rpcCode, rf = gd.readMessage(w, r); rf != nil {
			reject(nil, rpcCode, rf)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	if rf := gd.checkSession(r, msg, id); rf != nil {
		rpcCode := codeInvalidRequest
		reject(msg.ID, rpcCode, rf)
		return
	}
	spec := call.Spec{Kind: kindOf(r.Method, msg), Identity: id, Target: audit.Target{Method: msg.Method},
		Span: "mcp " + spanMethod(r.Method, msg), BytesIn: int64(len(body))}
	call.Run(r.Context(), gd.g.core, spec, func(ctx context.Context, cl *call.Call) (struct{}, *call.Refusal) {
		if r.Method == http.MethodPost {
			if rf := readOnce(body, msg.Method); rf != nil {
				return struct{}{}, rf
			}
		}
		gd.serveCall(ctx, w, r, cl, msg, body, id)
		return struct{}{}, nil
	}, func(rf *call.Refusal) struct{} {
		// No room for this request's event (a full disk): nothing of it is answered but the
		// refusal, whatever its method (docs/audit.md). Otherwise its parameters were refused.
		rpcCode := codeInvalidParams
		if rf.Code == call.CodeAuditUnavailable {
			rpcCode = codeInternalError
		}
		writeRPCError(w, rf.Status(), msg.ID, rpcCode, rf)
		return struct{}{}
	})
}

// serveCall serves a request whose call has begun: everything it writes goes through the
// response guard (scrubwriter.go) and the writer that counts it and holds an SSE response's end
// (final.go); the call finishes, its event written, before that end is let go.
func (gd *guard) serveCall(ctx context.Context, w http.ResponseWriter, r *http.Request, cl *call.Call, msg rpcMessage, body []byte, id identity.Identity) {
	rec := &countingWriter{ResponseWriter: w, n: &cl.BytesOut, cl: cl, hold: holdFinal(ctx, r)}
	var echoed atomic.Bool
	sw := newScrubWriter(rec, gd.g.guard.Current(), func() { echoed.Store(true) })
	defer func() {
		sw.end()
		cl.Answered(rec.status())
		if echoed.Load() {
			cl.CredentialEchoed()
		}
		cl.Finish()
		rec.release(ctx)
	}()
	if msg.Method == string(mcp.MethodResourcesRead) && !gd.g.readable(ctx, cl, msg.Params.URI) {
		// A resource the caller may not read answers exactly like one that does not exist.
		writeRPCResult(sw, msg.ID, resourceNotFound(r, msg.Params.URI))
		return
	}
	if msg.Method == string(mcp.MethodToolsCall) && gd.g.unseen.Load() > 0 &&
		gd.g.answerUnseen(ctx, &callState{call: cl, w: sw, id: msg.ID, body: body}) {
		return // a tool of an upstream never seen (lastknown.go)
	}
	gd.serve(ctx, sw, r, cl.Kind(), msg, id)
}

// serve hands a request that passed the guard's checks (of kind, from caller id) to what
// answers it: the gateway itself (a sandbox's answer to a request of the gateway's, its
// session's GET stream, a list) or mcp-go.
func (gd *guard) serve(ctx context.Context, sw http.ResponseWriter, r *http.Request, kind audit.Kind, msg rpcMessage, id identity.Identity) {
	sid, sess := gd.session(ctx, r, id)
	if kind == audit.KindResponse && gd.g.sandboxAnswered(sid, msg) {
		sw.WriteHeader(http.StatusAccepted)
		return
	}
	if r.Method == http.MethodGet { // a standalone stream ends when the listener drains
		var end context.CancelFunc
		ctx, end = context.WithCancel(ctx)
		defer end()
		defer context.AfterFunc(gd.g.streams, end)()
	}
	if r.Method == http.MethodGet && sess != nil && gd.g.ownsStream(ctx, sid, r.Header.Get("Last-Event-ID")) {
		sess.stream.serve(sw, r.WithContext(ctx), r.Header.Get("Last-Event-ID"))
		return
	}
	if k, ok := listKinds[msg.Method]; ok {
		gd.g.serveVerbatim(sw, r.WithContext(ctx), gd.next, k)
		return
	}
	if r.Method == http.MethodPost && sess != nil && msg.Method != "" && len(msg.ID) > 0 {
		// A dropped connection is not a cancellation (the sandbox resumes the call's stream with
		// Last-Event-ID): the request runs on, bounded by the upstream's call_timeout, until it
		// is answered, cancelled (notifications/cancelled) or its session ends.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		stop := context.AfterFunc(sess.ctx, cancel)
		defer stop()
	}
	ctx, extras := withExtras(ctx, msg.Method, msg.ID)
	out := newResponseWriter(sw, gd.g.events, sid, extras)
	defer out.end()
	gd.next.ServeHTTP(out, r.WithContext(ctx))
}

// session is the sandbox session a request of a legacy revision names, as the gateway keeps it
// (nil for a request without one).
func (gd *guard) session(ctx context.Context, r *http.Request, who identity.Identity) (string, *sandboxSession) {
	sid := r.Header.Get(server.HeaderKeySessionID)
	if sid == "" || modernRequest(r) {
		return "", nil
	}
	s := gd.g.sandboxes.open(ctx, sid)
	s.seen(who)
	if _, known := s.capabilities(); !known {
		if rec := gd.g.sessions.record(sid); rec != nil && rec.Initialized {
			s.initialized(rec.ClientInfo, rec.Capabilities, rec.ProtocolVersion) // adopted from another replica
		}
	}
	return sid, s
}

// readMessage reads and checks a POST body: its media type, size and JSON-RPC shape.
func (gd *guard) readMessage(w http.ResponseWriter, r *http.Request) ([]byte, rpcMessage, int, *call.Refusal) {
	var msg rpcMessage
	mt, err := mediatype.Of(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return nil, msg, codeInvalidRequest, call.Refuse(call.CodeUnsupportedMediaType, "Content-Type must be application/json")
	}
	cfg := gd.g.opts.Config
	call.BoundBody(w, r, call.BodyTiming{Timeout: cfg.BodyTimeout.D(), MinRate: cfg.MinBodyRate})
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, msg, codeInvalidRequest, call.Refuse(call.CodeBodyTooLarge, "request body too large")
		}
		if call.IsBodyTimeout(err) {
			w.Header().Set("Connection", "close")
			return nil, msg, codeInvalidRequest, call.Refuse(call.CodeBodyTimeout, "request body not received in time")
		}
		return nil, msg, codeParseError, call.Refuse(call.CodeBodyReadFailed, "could not read the request body")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return nil, msg, codeInvalidRequest, call.Refuse(call.CodeBatchRefused, "batch requests are not supported")
	}
	if m, ok := scanMessage(trimmed); ok {
		return body, m, 0, nil
	}
	if err := json.Unmarshal(trimmed, &msg); err != nil {
		return nil, msg, codeParseError, call.Refuse(call.CodeMalformedRequest, "parse error: body is not a JSON-RPC message object")
	}
	return body, msg, 0, nil
}

// checkSession checks the Mcp-Session-Id of a request, and the session caps of an initialize.
func (gd *guard) checkSession(r *http.Request, msg rpcMessage, id identity.Identity) *call.Refusal {
	sid := r.Header.Get(server.HeaderKeySessionID)
	peer, _ := identity.ParsePeer(r.RemoteAddr)
	switch {
	case sid != "":
		switch gd.g.sessions.check(r.Context(), sid, peer) {
		case sessionNotOwned:
			return call.Refuse(call.CodeSessionNotOwned, "session not found or expired; send initialize to start a new session")
		case sessionUnknown:
			return call.Refuse(call.CodeNotFound, "session not found or expired; send initialize to start a new session")
		}
	case r.Method == http.MethodPost && msg.Method == string(mcp.MethodInitialize):
		cfg := gd.g.opts.Config
		if n := gd.g.sessions.countPeer(peer); n >= cfg.MaxSessionsPerSandbox {
			return call.Refuse(call.CodeSessionLimit, "sandbox %s has %d live MCP sessions, the limit; end one (DELETE) first", id.Key(), n)
		}
		if gd.g.sessions.count() >= cfg.MaxSessions {
			return call.Refuse(call.CodeSessionLimit, "this replica holds %d MCP sessions, its limit", cfg.MaxSessions)
		}
	case r.Method == http.MethodPost && !modernRequest(r):
		return call.Refuse(call.CodeSessionRequired, "Mcp-Session-Id header is required after initialize")
	case r.Method == http.MethodDelete:
		return call.Refuse(call.CodeSessionRequired, "Mcp-Session-Id header is required")
	}
	return nil
}

// methodKinds are the event kinds of the MCP methods the gateway serves.
var methodKinds = map[string]audit.Kind{
	string(mcp.MethodInitialize):             audit.KindInitialize,
	string(mcp.MethodPing):                   audit.KindPing,
	string(mcp.MethodToolsList):              audit.KindToolsList,
	string(mcp.MethodToolsCall):              audit.KindToolsCall,
	string(mcp.MethodResourcesList):          audit.KindResourcesList,
	string(mcp.MethodResourcesTemplatesList): audit.KindTemplatesList,
	string(mcp.MethodResourcesRead):          audit.KindResourcesRead,
	string(mcp.MethodResourcesSubscribe):     audit.KindSubscribe,
	string(mcp.MethodResourcesUnsubscribe):   audit.KindUnsubscribe,
	string(mcp.MethodPromptsList):            audit.KindPromptsList,
	string(mcp.MethodPromptsGet):             audit.KindPromptsGet,
	string(mcp.MethodCompletionComplete):     audit.KindComplete,
	string(mcp.MethodSetLogLevel):            audit.KindSetLevel,
}

// kindOf is the event kind of one HTTP request to /mcp.
func kindOf(httpMethod string, msg rpcMessage) audit.Kind {
	switch {
	case httpMethod == http.MethodGet:
		return audit.KindStream
	case httpMethod == http.MethodDelete:
		return audit.KindSessionEnd
	case msg.Method == "" && (msg.Result != nil || msg.Error != nil):
		return audit.KindResponse
	case strings.HasPrefix(msg.Method, "notifications/"):
		return audit.KindNotification
	}
	if k, ok := methodKinds[msg.Method]; ok {
		return k
	}
	return audit.KindOtherMethod
}

func spanMethod(httpMethod string, msg rpcMessage) string {
	if msg.Method != "" {
		return msg.Method
	}
	return httpMethod
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

// resourceNotFound is the one answer to a resources/read of a URI the caller cannot read,
// whether it does not exist or policy hides it: the code of the request's protocol revision.
func resourceNotFound(r *http.Request, uri string) rpcError {
	code := codeResourceGone
	if modernRequest(r) {
		code = codeInvalidParams
	}
	return rpcError{Code: code, Message: "resource not found", Data: map[string]string{"uri": uri}}
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

// writeRPCResult answers a request with a JSON-RPC error in a 200 response, as a server does
// for a request it read and could not serve.
func writeRPCResult(w http.ResponseWriter, id json.RawMessage, e rpcError) {
	writeRPC(w, http.StatusOK, id, e)
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

// countingWriter counts the response bytes and remembers the status, and holds the end of a
// held answer's response in an SSE stream (final.go); Unwrap keeps flushing (SSE) working.
type countingWriter struct {
	http.ResponseWriter
	n    interface{ Add(int64) int64 }
	code int
	// cl is the call answered: a refusal it ended with (a tool call over a rate limit,
	// answered as a tool error result) sends its headers, Retry-After, as the proxy does.
	cl *call.Call
	// hold says the answer waits for its call's event; final is the response's held end.
	hold  bool
	final []byte
}

func (c *countingWriter) WriteHeader(code int) {
	if c.code == 0 && code >= 200 {
		c.refusalHeaders()
		c.code = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.refusalHeaders()
		c.code = http.StatusOK
	}
	if held, err := c.writeHeld(b); held {
		if err != nil {
			return 0, err
		}
		return len(b), nil
	}
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (c *countingWriter) refusalHeaders() {
	if rf := c.cl.Refusal(); rf != nil {
		rf.SetHeaders(c.Header())
	}
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *countingWriter) status() int {
	if c.code == 0 {
		return http.StatusOK
	}
	return c.code
}
