package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/jsonscan"
	"github.com/sandgate/sandgate/internal/mediatype"
)

// The gateway decides first and relays: a sandbox's request is one call (internal/call's
// Run), whose Ask reads the message once (message.go) and asks policy what the method's table
// entry says (methods.go), and whose Act either answers it itself (initialize, server/discover,
// the lists, ping, subscriptions) or sends the sandbox's own bytes on to the upstream session it
// belongs to, rewritten only where the gateway owns them (forward.go), and relays what comes
// back. Nothing of the request reaches an upstream before policy allowed it.

// exchange is one sandbox request to /mcp on its way through the gateway.
type exchange struct {
	g  *Gateway
	r  *http.Request
	id identity.Identity
	cl *call.Call
	w  *guardedWriter
	// out writes the answer (answer.go); echoed says the guard removed a credential from it.
	out    *answer
	echoed atomic.Bool

	body    []byte
	msg     sandboxMessage
	meta    requestMeta
	m       *method
	modern  bool // of 2026-07-28 or later: no session, the protocol's fields in each request
	sid     string
	session *sandboxSession
	// inBand is set once the message is read as a request the gateway serves: a refusal is then
	// answered in the protocol (a JSON-RPC error or a tool's error result) rather than by the
	// HTTP status alone.
	inBand bool

	// What a forwarded request targets (forward.go).
	up   *upstream
	name string          // the upstream's own name of the tool or prompt, or the resource URI
	def  json.RawMessage // the tool's definition (tools/call), for its Mcp-Param headers
	gone bool            // the target is hidden from the caller or does not exist
	// upModern says the upstream session answering it is of 2026-07-28 or later.
	upModern bool
}

// response is what answers a request after its call ended: a held response to let go, or an HTTP
// status without a body (a notification, a sandbox's answer), or nothing (a stream act served).
type response struct {
	held   bool
	status int
}

// serveExchange serves one request of a known sandbox as one call.
func (g *Gateway) serveExchange(w http.ResponseWriter, r *http.Request, id identity.Identity) {
	x := &exchange{g: g, r: r, id: id}
	x.w = newGuardedWriter(w, g.guard.Current(), new(atomic.Int64), func() { x.echoed.Store(true) })
	x.out = newAnswer(g, x.w, "")
	kind := audit.KindMCPRequest
	switch r.Method {
	case http.MethodGet:
		kind = audit.KindStream
	case http.MethodDelete:
		kind = audit.KindSessionEnd
	}
	rep := call.Run(r.Context(), g.core, call.Spec{Kind: kind, Identity: id, Target: audit.Target{Method: r.Method},
		Span: "mcp " + r.Method}, call.Steps[response]{
		Ask: func(ctx context.Context, cl *call.Call) (call.Question, *call.Refusal) {
			x.cl = cl
			x.w.counts(&cl.BytesOut)
			return x.ask(ctx)
		},
		Act:     x.act,
		Refused: x.refused,
	})
	switch {
	case rep.held:
		x.out.release(call.ReleaseFrom(r.Context()))
	case rep.status != 0:
		w.WriteHeader(rep.status)
	}
}

// ask reads the request as far as its method's question for policy.
func (x *exchange) ask(ctx context.Context) (call.Question, *call.Refusal) {
	switch x.r.Method {
	case http.MethodPost:
	case http.MethodGet:
		return x.askStream()
	case http.MethodDelete:
		return call.Question{}, x.session0(true)
	default:
		return call.Question{}, call.Refuse(call.CodeMalformedRequest, "method %s is not served at /mcp; use POST", x.r.Method)
	}
	if rf := x.read(); rf != nil {
		return call.Question{}, rf
	}
	x.m = methodOf(x.msg)
	x.cl.Classify(x.m.kind)
	x.cl.Describe(audit.Target{Method: x.msg.Method})
	if x.msg.Method != "" {
		x.cl.Span().SetName("mcp " + x.msg.Method)
	}
	if rf := x.protocol(); rf != nil {
		return call.Question{}, rf
	}
	x.inBand = x.msg.isRequest()
	if x.m.ask == nil {
		return call.Question{}, nil
	}
	return x.m.ask(ctx, x)
}

// read reads the POST body, bounded, and the one JSON-RPC message it must be.
func (x *exchange) read() *call.Refusal {
	mt, err := mediatype.Of(x.r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return call.Refuse(call.CodeUnsupportedMediaType, "Content-Type must be application/json")
	}
	cfg := x.g.opts.Config
	call.BoundBody(x.w, x.r, call.BodyTiming{Timeout: cfg.BodyTimeout.D(), MinRate: cfg.MinBodyRate})
	body, err := io.ReadAll(http.MaxBytesReader(x.w, x.r.Body, cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			rf := call.Refuse(call.CodeBodyTooLarge, "request body larger than %d bytes", cfg.MaxBodyBytes)
			rf.Close = true
			return rf
		case call.IsBodyTimeout(err):
			rf := call.Refuse(call.CodeBodyTimeout, "request body not received in time")
			rf.Close = true
			return rf
		}
		return call.Refuse(call.CodeBodyReadFailed, "could not read the request body")
	}
	x.body = body
	x.cl.BytesIn.Store(int64(len(body)))
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return call.Refuse(call.CodeBatchRefused, "batch requests are not supported")
	}
	if err := jsonscan.Unambiguous(trimmed); err != nil {
		if errors.Is(err, jsonscan.ErrAmbiguous) {
			var head struct { // only to say which request is refused, and what it seemed to be
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(trimmed, &head) == nil {
				if head.ID != nil && validID(head.ID) {
					x.msg.ID = head.ID
				}
				x.cl.Classify(methodOf(sandboxMessage{Method: head.Method, ID: x.msg.ID}).kind)
			}
			return call.Refuse(call.CodeBadParams, "params are read differently by different JSON readers: %v", err)
		}
		return call.Refuse(call.CodeMalformedRequest, "parse error: body is not a JSON-RPC message object")
	}
	if x.msg, err = readMessage(trimmed); err != nil || (x.msg.Method == "" && !x.msg.isResponse()) {
		return call.Refuse(call.CodeMalformedRequest, "parse error: body is not a JSON-RPC message object")
	}
	if args := x.msg.p.arguments; x.msg.Method == string(mcp.MethodToolsCall) && args != nil && args[0] != '{' {
		x.cl.Classify(audit.KindToolsCall)
		return call.Refuse(call.CodeBadParams, "tools/call arguments must be a JSON object")
	}
	return nil
}

// act does what the allowed request asks, by its method.
func (x *exchange) act(ctx context.Context, _ *call.Call, g call.Grant) (response, call.End) {
	switch x.r.Method {
	case http.MethodGet:
		return x.serveStream(ctx)
	case http.MethodDelete:
		return x.endSession()
	}
	rep, end := x.m.act(x, ctx, g)
	if x.echoed.Load() {
		x.cl.CredentialEchoed()
	}
	return rep, end
}

// respond writes msg, the JSON-RPC response to the request, held until the call's event is
// written.
func (x *exchange) respond(msg []byte) response {
	x.out.final(msg, false)
	if x.echoed.Load() {
		x.cl.CredentialEchoed()
	}
	return response{held: true}
}

// respondListed is respond for a list: sent as one SSE event to a client that accepts a stream,
// as SDKs that always stream (the Go SDK's) answer lists, so that a list reads the same through
// Sandgate as from such an upstream.
func (x *exchange) respondListed(msg []byte) response {
	x.out.final(msg, strings.Contains(x.r.Header.Get("Accept"), "text/event-stream"))
	return response{held: true}
}

// result is the response to the request carrying result (as written).
func (x *exchange) result(result []byte) []byte {
	b := make([]byte, 0, len(result)+len(x.msg.ID)+32)
	b = append(append(append(b, `{"jsonrpc":"2.0","id":`...), x.msg.ID...), `,"result":`...)
	return append(append(b, result...), '}')
}

// rpcError is the response to the request carrying a JSON-RPC error.
func (x *exchange) rpcError(code int, text string, data any) []byte {
	return rpcErrorBody(x.msg.ID, rpcError{Code: code, Message: text, Data: data})
}

// refused answers a refusal, after Run ended the call with it: in the protocol once the
// request was read as one the gateway serves (its method's shape: a tool's error result, a
// JSON-RPC error), else as a JSON-RPC error with the refusal's HTTP status.
func (x *exchange) refused(rf *call.Refusal) response {
	rf.SetHeaders(x.w.Header())
	if rf.Close {
		x.w.Header().Set("Connection", "close")
	}
	if !x.inBand || outOfBand(rf) {
		return x.refuseHTTP(rf, x.msg.ID)
	}
	if x.m != nil && x.m.refused != nil {
		x.writeNow(x.m.refused(x, rf))
		return response{}
	}
	x.writeNow(x.rpcError(rpcCodeOf(rf), rf.Reason, refusalData{Code: rf.Code}))
	return response{}
}

// outOfBand reports a refusal answered by its HTTP status whatever the request: Sandgate unable
// to record it (503) or shutting down, a request the protocol itself refuses (2026-07-28's
// header checks, 400).
func outOfBand(rf *call.Refusal) bool {
	switch rf.Code {
	case call.CodeAuditUnavailable, call.CodeShuttingDown, call.CodeShutdown, call.CodeHeaderMismatch, call.CodeUnsupportedVersion:
		return true
	}
	return false
}

// refuseHTTP answers rf with its status and a JSON-RPC error (id when the request's is known).
func (x *exchange) refuseHTTP(rf *call.Refusal, id json.RawMessage) response {
	code := rpcCodeOf(rf)
	if rf.Class() == call.ClassNotFound {
		code = codeInvalidRequest // the session, not the request's target
	}
	writeRPCError(x.w, rf.Status(), id, code, rf)
	return response{}
}

// writeNow writes msg as the whole answer, at once (a refusal's, whose event is written).
func (x *exchange) writeNow(msg []byte) {
	x.out.final(msg, false)
	x.out.release(nil)
}

// rpcCodeOf is the JSON-RPC error code a refusal is answered with.
func rpcCodeOf(rf *call.Refusal) int {
	switch rf.Class() {
	case call.ClassBadRequest, call.ClassTooLarge, call.ClassMediaType, call.ClassTimeout:
		switch rf.Code {
		case call.CodeMalformedRequest, call.CodeBodyReadFailed:
			return codeParseError
		case call.CodeBadParams:
			return codeInvalidParams
		case call.CodeHeaderMismatch:
			return mcp.HEADER_MISMATCH
		case call.CodeUnsupportedVersion:
			return mcp.UNSUPPORTED_PROTOCOL_VERSION
		}
		return codeInvalidRequest
	case call.ClassNotFound:
		return codeInvalidParams
	case call.ClassUnavailable:
		return codeInternalError
	}
	return codeInvalidRequest
}
