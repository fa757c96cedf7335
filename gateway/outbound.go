package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/jsonenc"
)

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
	case to.call != nil && to.call.exchange() != nil:
		who = to.call.exchange().id
	case to.session != nil:
		who = to.session.identity()
	}
	return call.Run(ctx, g.core, call.Spec{Kind: audit.KindServerRequest, Identity: who, Target: audit.Target{Upstream: u.cfg.Name, Method: in.method}},
		call.Steps[clientReply]{
			Ask: func(context.Context, *call.Call) (call.Question, *call.Refusal) { return call.Question{}, nil },
			Act: func(ctx context.Context, cl *call.Call, _ call.Grant) (clientReply, call.End) {
				return g.askSandbox(ctx, cl, to, u, in)
			},
			Refused: func(rf *call.Refusal) clientReply {
				if rf.Code == call.CodeAuditUnavailable {
					return errorReply(codeInternalError, rf.Reason)
				}
				return errorReply(mcp.METHOD_NOT_FOUND, rf.Reason)
			},
		})
}

// askSandbox is ask's act: it relays the request and waits for the sandbox's answer.
func (g *Gateway) askSandbox(ctx context.Context, cl *call.Call, to askTarget, u *upstream, in inbound) (clientReply, call.End) {
	cl.BytesOut.Store(int64(len(in.raw)))
	if _, echoed := g.guard.Current().ScrubString(string(in.raw)); echoed {
		cl.CredentialEchoed() // what reaches the sandbox is scrubbed on its stream
	}
	if to.call != nil {
		if x := to.call.exchange(); x != nil && x.modern {
			return g.askModern(ctx, cl, to.call, x, u, in)
		}
	}
	if to.session == nil {
		return clientReply{}, call.Refused(call.Refuse(call.CodeUpstreamInputUnanswered, "%s", in.method+": no sandbox session can be asked"))
	}
	if !to.session.hasCapability(in.method) {
		return clientReply{}, call.Refused(call.Refuse(call.CodeUpstreamInputUnsupported, "%s", in.method+": the sandbox's client does not declare that capability"))
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
			return r, call.Failed(call.Refuse(call.CodeUpstreamInputUnanswered, "the sandbox answered an error"))
		}
		return r, call.Answered(http.StatusOK)
	case <-ctx.Done():
	case <-callDone:
	case <-to.session.ctx.Done():
	}
	return errorReply(mcp.REQUEST_INTERRUPTED, in.method+": the sandbox did not answer"),
		call.Failed(call.Refuse(call.CodeUpstreamInputUnanswered, "the sandbox did not answer in time"))
}

// askModern asks a 2026-07-28 sandbox, through its parked call's input_required (mrtr.go).
func (g *Gateway) askModern(ctx context.Context, cl *call.Call, c *inflightCall, x *exchange, u *upstream, in inbound) (clientReply, call.End) {
	if !declares(x.meta.caps, in.method) {
		return clientReply{}, call.Refused(call.Refuse(call.CodeUpstreamInputUnsupported, "%s", in.method+": the sandbox's request does not declare that capability"))
	}
	p, _ := c.ctx.Value(parkedKey{}).(*parkedCall)
	if p == nil {
		return clientReply{}, call.Refused(call.Refuse(call.CodeUpstreamInputUnanswered, "%s", in.method+": the request cannot be asked for input"))
	}
	r, ok := p.askParked(ctx, in, u.cfg.CallTimeout.D())
	if !ok {
		return errorReply(mcp.REQUEST_INTERRUPTED, in.method+": the sandbox did not answer"),
			call.Failed(call.Refuse(call.CodeUpstreamInputUnanswered, "the sandbox did not answer in time"))
	}
	cl.BytesIn.Store(int64(len(r.result) + len(r.err)))
	if in.method == string(mcp.MethodListRoots) {
		r.result = withRoots(r.result)
	}
	return r, call.Answered(http.StatusOK)
}

// declares reports whether caps, a 2026-07-28 request's client capabilities, has what a request
// of method needs (a method that needs none is no request that revision can ask).
func declares(caps *mcp.ClientCapabilities, method string) bool {
	if caps == nil {
		return false
	}
	has, needs := capabilityFor(*caps, method)
	return needs && has
}

// capabilityFor is whether caps has the capability a server request of method needs, and
// whether it needs one (sampling, elicitation and roots do).
func capabilityFor(caps mcp.ClientCapabilities, method string) (has, needs bool) {
	switch mcp.MCPMethod(method) {
	case mcp.MethodSamplingCreateMessage:
		return caps.Sampling != nil, true
	case mcp.MethodElicitationCreate:
		return caps.Elicitation != nil, true
	case mcp.MethodListRoots:
		return caps.Roots != nil, true
	}
	return true, false
}

// requestBytes is a request with id, method and params (as written).
func requestBytes(id json.RawMessage, method string, params json.RawMessage) []byte {
	b := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	b = jsonenc.AppendString(append(b, `,"method":`...), method)
	if len(params) > 0 {
		b = append(append(b, `,"params":`...), params...)
	}
	return append(b, '}')
}

// sandboxAnswered takes a sandbox's POST of a response (msg) to a request the gateway asked of
// it; false when it answers none the gateway awaits.
func (g *Gateway) sandboxAnswered(sid string, msg sandboxMessage) bool {
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
