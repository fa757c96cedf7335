package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
)

// A message for a call's stream (a notification, a request to the sandbox) goes through the
// session mcp-go serves that call's POST with (sandboxes.go), the one way into that stream in
// order with the call's result. mcp-go's channel carries notifications only, so each message
// travels wrapped in a relay notification whose one parameter is the message as written,
// base64-encoded (mcp-go's encoding/json would respell the message; base64 keeps its bytes).
// The event store records the message unwrapped and the guard's writer writes it unwrapped:
// no sandbox ever reads a relay notification.

const relayMethod = "sandgate/relay"

var relayPrefix = []byte(`{"jsonrpc":"2.0","method":"` + relayMethod + `"`)

// relayToCall sends msg, one JSON-RPC message, on call c's stream.
func (g *Gateway) relayToCall(c *inflightCall, msg []byte) {
	err := g.mcp.SendNotificationToClient(c.ctx, relayMethod, map[string]any{"message": base64.StdEncoding.EncodeToString(msg)})
	if err != nil {
		g.log.Debug("message for a call's stream not delivered", "err", err)
	}
}

// unrelayed is msg, when it is a relay notification, as the message it carries.
func unrelayed(msg []byte) ([]byte, bool) {
	if !bytes.HasPrefix(msg, relayPrefix) {
		return nil, false
	}
	var n struct {
		Params struct {
			Message []byte `json:"message"` // base64, as encoding/json reads []byte
		} `json:"params"`
	}
	if json.Unmarshal(msg, &n) != nil || len(n.Params.Message) == 0 {
		return nil, false
	}
	return n.Params.Message, true
}

// askTarget is the sandbox an upstream's request is asked of: on a call's stream, or on the
// GET stream of a session.
type askTarget struct {
	call    *inflightCall
	session *sandboxSession
}

// pendingAsks are the requests the gateway sent sandboxes and awaits answers to, by sandbox
// session and request ID.
type pendingAsks struct {
	next atomic.Uint64
	mu   sync.Mutex
	byID map[string]chan clientReply
}

func newPendingAsks() *pendingAsks { return &pendingAsks{byID: map[string]chan clientReply{}} }

func pendingKey(sid string, id json.RawMessage) string { return sid + "\x00" + string(id) }

func (p *pendingAsks) add(sid string) (json.RawMessage, chan clientReply) {
	id := json.RawMessage(strconv.Quote("sg-ask-" + strconv.FormatUint(p.next.Add(1), 10)))
	ch := make(chan clientReply, 1)
	p.mu.Lock()
	p.byID[pendingKey(sid, id)] = ch
	p.mu.Unlock()
	return id, ch
}

func (p *pendingAsks) remove(sid string, id json.RawMessage) {
	p.mu.Lock()
	delete(p.byID, pendingKey(sid, id))
	p.mu.Unlock()
}

// answer delivers a sandbox's response to the request it answers; false if it answers none the
// gateway awaits.
func (p *pendingAsks) answer(sid string, id json.RawMessage, r clientReply) bool {
	p.mu.Lock()
	ch, ok := p.byID[pendingKey(sid, id)]
	delete(p.byID, pendingKey(sid, id))
	p.mu.Unlock()
	if ok {
		ch <- r
	}
	return ok
}

// ask sends an upstream's request to the sandbox it concerns and returns the sandbox's answer,
// as written. It is one audit event (mcp.server_request), refused when the sandbox cannot be
// asked: its session is of a revision without such requests, or its client did not declare
// the capability the method needs. Waiting is bounded by the upstream's call_timeout, the
// call (if it is asked in one) and the session.
func (g *Gateway) ask(ctx context.Context, to askTarget, u *upstream, in inbound) clientReply {
	var who identity.Identity
	switch {
	case to.call != nil:
		who = identityFrom(to.call.ctx)
	case to.session != nil:
		who = to.session.identity()
	}
	return call.Run(ctx, g.core, audit.KindServerRequest, who, func(ctx context.Context, cl *call.Call) (clientReply, *call.Refusal) {
		return g.askSandbox(ctx, cl, to, u, in)
	}, func(rf *call.Refusal) clientReply {
		if rf.Code == call.CodeAuditUnavailable {
			return errorReply(codeInternalError, rf.Reason)
		}
		return errorReply(mcp.METHOD_NOT_FOUND, rf.Reason)
	})
}

// askSandbox is ask's act: it relays the request and waits for the sandbox's answer.
func (g *Gateway) askSandbox(ctx context.Context, cl *call.Call, to askTarget, u *upstream, in inbound) (clientReply, *call.Refusal) {
	cl.Describe(audit.Target{Upstream: u.cfg.Name, Method: in.method})
	cl.BytesOut.Store(int64(len(in.raw)))
	if to.session == nil {
		return clientReply{}, call.Refuse(call.CodeUpstreamInputUnanswered, "%s", in.method+": the sandbox's session (2026-07-28) takes no requests from the server")
	}
	if !to.session.hasCapability(in.method) {
		return clientReply{}, call.Refuse(call.CodeUpstreamInputUnsupported, "%s", in.method+": the sandbox's client does not declare that capability")
	}
	if _, echoed := g.guard.Current().ScrubString(string(in.raw)); echoed {
		cl.CredentialEchoed() // what reaches the sandbox is scrubbed on its stream
	}
	id, answered := g.asks.add(to.session.id)
	defer g.asks.remove(to.session.id, id)
	msg := requestBytes(id, in.method, in.params)
	if to.call != nil {
		g.relayToCall(to.call, msg)
	} else {
		to.session.stream.deliver(msg)
	}
	ctx, cancel := context.WithTimeout(ctx, u.cfg.CallTimeout.D())
	defer cancel()
	var callDone <-chan struct{}
	if to.call != nil {
		callDone = to.call.ctx.Done()
	}
	select {
	case r := <-answered:
		cl.BytesIn.Store(int64(len(r.result) + len(r.err)))
		if r.err != nil {
			cl.Fail(call.Refuse(call.CodeUpstreamInputUnanswered, "the sandbox answered an error"))
		} else {
			cl.Answered(http.StatusOK)
		}
		return r, nil
	case <-ctx.Done():
	case <-callDone:
	case <-to.session.ctx.Done():
	}
	cl.Fail(call.Refuse(call.CodeUpstreamInputUnanswered, "the sandbox did not answer in time"))
	return errorReply(mcp.REQUEST_INTERRUPTED, in.method+": the sandbox did not answer"), nil
}

// requestBytes is a request with id, method and params (as written).
func requestBytes(id json.RawMessage, method string, params json.RawMessage) []byte {
	b := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	b = appendJSONString(append(b, `,"method":`...), method)
	if len(params) > 0 {
		b = append(append(b, `,"params":`...), params...)
	}
	return append(b, '}')
}

// sandboxAnswered takes a sandbox's POST of a response (msg) to a request the gateway asked of
// it; false when it answers none the gateway awaits (mcp-go then answers it).
//
// ownsStream reports whether a GET of session sid with Last-Event-ID last (none: a new stream)
// is for the session's GET stream, which the gateway serves; a GET resuming a call's stream is
// mcp-go's.
func (g *Gateway) sandboxAnswered(sid string, msg rpcMessage) bool {
	if sid == "" || len(msg.ID) == 0 {
		return false
	}
	var r clientReply
	if len(msg.Error) > 0 && string(msg.Error) != "null" {
		r.err = msg.Error
	} else {
		r.result = msg.Result
	}
	if r.result == nil && r.err == nil {
		r.result = json.RawMessage(`{}`)
	}
	return g.asks.answer(sid, msg.ID, r)
}

func (g *Gateway) ownsStream(ctx context.Context, sid, last string) bool {
	if last == "" {
		return true
	}
	stream, ok := g.events.streamOf(ctx, sid, last)
	return ok && stream == listenStream
}

// requestLogLevel is the log level a 2026-07-28 request asked for; "" for none (or a legacy
// request).
func requestLogLevel(ctx context.Context) mcp.LoggingLevel {
	if info := server.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		return info.LogLevel
	}
	return ""
}
