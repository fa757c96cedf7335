package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
	"github.com/sandgate/sandgate/policy"
)

// The requests a sandbox sends on to an upstream: tools/call, prompts/get, resources/read and
// completion/complete (tasks/* in tasks.go). Ask finds the target in the catalog and asks
// policy, with the arguments as the upstream will read them; Act sends the sandbox's own bytes
// to the upstream session the request belongs to (relayparams.go), relays what the upstream
// sends about the call on the request's stream (route.go), and answers with the upstream's
// result as written, through the response guard.
//
// A target the caller may not see, or that does not exist, is decided by policy like any
// (input.mcp.visible false, or input.mcp.exists false: the decision log, replay and the shadow
// policy see the call) and answered as absence whatever the decision: hidden and missing look
// the same to a sandbox, and no upstream is asked.

// askToolCall is tools/call's question: mcp.tools_call, with its arguments.
func askToolCall(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
	name := jsonscan.String(x.msg.p.name)
	x.cl.Describe(audit.Target{Tool: name})
	args := x.msg.p.arguments
	decoded, err := decodeArguments(args)
	if err != nil {
		return call.Question{}, call.Refuse(call.CodeBadParams, "tools/call arguments: %v", err)
	}
	t := audit.Target{Tool: name}
	if args != nil {
		sum := sha256.Sum256(args)
		t.ArgsSHA256 = hex.EncodeToString(sum[:])
	}
	n, ok := x.g.tool(name)
	if !ok {
		if u, tool, unseen := x.g.unseenTool(ctx, name); unseen {
			x.up, x.name = u, tool
		} else if n, ok = x.g.tool(name); !ok { // its upstream may have connected meanwhile
			x.cl.Describe(t)
			return x.absent(audit.KindToolsCall, nil, name, nil), nil
		}
	}
	if ok {
		x.up, x.name, x.def = n.upstream, n.name, n.raw
	}
	t.Upstream, t.Tool = x.up.cfg.Name, x.name
	x.cl.Describe(t)
	if ok && (!x.g.visible(ctx, x.caller(), audit.KindToolsList, n.upstream.cfg.Name, n.name) || !x.g.capabilityOf(ctx, x.caller()).allows(n.upstream, n.name)) {
		return x.absent(audit.KindToolsCall, x.up, x.name, decoded), nil
	}
	return x.question(audit.KindToolsCall, decoded, true), nil
}

// askPrompt is prompts/get's question: mcp.prompts_get, with its arguments.
func askPrompt(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
	name := jsonscan.String(x.msg.p.name)
	x.cl.Describe(audit.Target{Tool: name})
	var args map[string]any
	if a := x.msg.p.arguments; a != nil && json.Unmarshal(a, &args) != nil {
		return call.Question{}, call.Refuse(call.CodeBadParams, "prompts/get arguments must be an object of strings")
	}
	n, ok := x.g.prompt(name)
	if !ok {
		return x.absent(audit.KindPromptsGet, nil, name, nil), nil
	}
	x.up, x.name = n.upstream, n.name
	x.cl.Describe(audit.Target{Upstream: n.upstream.cfg.Name, Tool: n.name})
	if !x.g.visible(ctx, x.caller(), audit.KindPromptsGet, n.upstream.cfg.Name, n.name) {
		return x.absent(audit.KindPromptsGet, x.up, x.name, args), nil
	}
	return x.question(audit.KindPromptsGet, args, true), nil
}

// absent is the question of a request whose target the caller cannot see (of upstream u) or
// that does not exist (u nil): decided without counting or a credential, answered as absence
// (forward: answerAbsent; a refusal: the method's refused answer).
func (x *exchange) absent(kind audit.Kind, u *upstream, name string, args map[string]any) call.Question {
	in := &policy.MCP{Tool: name, Arguments: args, Hidden: true}
	if u != nil {
		in.Upstream = u.cfg.Name
	} else {
		in.NotFound = true
	}
	x.gone = true
	return call.Question{Input: &policy.Input{Kind: kind, Identity: x.cl.Identity(), MCP: in}, Hidden: true}
}

// answerAbsent answers a request for a target the caller cannot see, which policy allowed: as
// absence, as its refusal would have been.
func (x *exchange) answerAbsent() (response, call.End) {
	rf := notFound("not found or not visible to the caller")
	return x.respond(x.m.refused(x, rf)), call.Hidden(rf)
}

// askRead is resources/read's question: mcp.resources_read, the URI as input.mcp.tool.
func askRead(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
	uri := jsonscan.String(x.msg.p.uri)
	x.cl.Describe(audit.Target{Tool: uri})
	u, ok := x.g.resourceUpstream(uri)
	if !ok {
		return call.Question{}, notFound("resource not found")
	}
	x.up, x.name = u, uri
	x.cl.Describe(audit.Target{Upstream: u.cfg.Name})
	q := x.question(audit.KindResourcesRead, nil, true)
	q.Hidden = true // a resource the caller may not read answers as one that does not exist
	return q, nil
}

// askComplete is completion/complete's question: decided on the kind of what is completed (a
// prompt the caller may get, a resource template it may read), without counting it.
func askComplete(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
	var ref struct {
		Type string `json:"type"`
		Name string `json:"name"`
		URI  string `json:"uri"`
	}
	_ = json.Unmarshal(orNull(x.msg.p.ref), &ref)
	switch ref.Type {
	case "ref/prompt":
		n, ok := x.g.prompt(ref.Name)
		if !ok || !x.g.visible(ctx, x.caller(), audit.KindPromptsGet, n.upstream.cfg.Name, n.name) {
			return call.Question{}, notFound("prompt not found or not visible to the caller")
		}
		x.up, x.name = n.upstream, n.name
		x.cl.Describe(audit.Target{Upstream: n.upstream.cfg.Name, Tool: n.name})
		return x.question(audit.KindPromptsGet, nil, false), nil
	case "ref/resource":
		u := x.g.templateUpstream(ref.URI)
		if u == nil {
			var ok bool
			if u, ok = x.g.resourceUpstream(ref.URI); !ok {
				return call.Question{}, notFound("resource not found")
			}
		}
		x.up, x.name = u, ref.URI
		x.cl.Describe(audit.Target{Upstream: u.cfg.Name, Tool: ref.URI})
		return x.question(audit.KindResourcesRead, nil, false), nil
	}
	return call.Question{}, call.Refuse(call.CodeBadParams, "completion/complete: ref must be ref/prompt or ref/resource")
}

// question is the policy question of a request to x.up about x.name.
func (x *exchange) question(kind audit.Kind, args map[string]any, admit bool) call.Question {
	in := &policy.Input{Kind: kind, Identity: x.cl.Identity(), MCP: &policy.MCP{Upstream: x.up.cfg.Name, Tool: x.name, Arguments: args}}
	q := call.Question{Input: in, Admit: admit}
	if c := x.up.cfg.Credential; c != nil {
		q.Credential = c.Name
	}
	return q
}

func notFound(reason string) *call.Refusal { return call.Refuse(call.CodeNotFound, "%s", reason) }

// decodeArguments are a tools/call's arguments as policy reads them: decoded from the bytes the
// upstream gets, numbers as written (json.Number), not as the nearest float64.
func decodeArguments(raw json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	d := argsDecoders.Get().(*argsDecoder)
	args, err := d.decode(raw)
	if d.ok {
		argsDecoders.Put(d)
	}
	return args, err
}

// forward sends an allowed request on to its upstream and answers with what it returns.
func (x *exchange) forward(ctx context.Context, _ call.Grant) (response, call.End) {
	if x.gone {
		return x.answerAbsent()
	}
	if x.msg.Method == string(mcp.MethodToolsCall) {
		release, deny := x.g.core.Admission().AcquireToolCall(ctx, x.cl.Identity())
		defer release()
		if deny != nil {
			return response{}, call.Refused(&call.Refusal{Code: string(deny.Code), Reason: deny.Reason, RetryAfter: deny.RetryAfter})
		}
	}
	if !x.up.seen() {
		return x.failed(x.failure(fmt.Errorf("%w: %w", errUpstreamDown, errNeverSeen)))
	}
	switch {
	case x.modern && x.msg.p.requestState != nil:
		return x.resume(ctx)
	case x.modern && mrtrMethods[x.msg.Method] && !x.up.modernConn():
		return x.forwardParked() // a legacy upstream may ask for input on the call's stream
	}
	ctx, stop := x.callContext(ctx)
	defer stop()
	params := x.relayParams()
	if x.msg.p.task != nil && !x.modern {
		params = params.with("task", x.msg.p.task) // the 2025-11-25 tasks model (tasks.go)
	}
	res, err := x.send(ctx, params)
	if err != nil && ctx.Err() == context.Canceled {
		// The sandbox cancelled it (notifications/cancelled, its session's end, or on 2026-07-28
		// a closed stream): a cancelled request gets no answer.
		return response{}, call.Cancelled()
	}
	return x.answerWith(res, err)
}

// mrtrMethods are the methods whose result may ask for input (2026-07-28).
var mrtrMethods = map[string]bool{string(mcp.MethodToolsCall): true, string(mcp.MethodPromptsGet): true,
	string(mcp.MethodResourcesRead): true}

// callContext is the context a forwarded call runs in. On a legacy session a dropped connection
// is not a cancellation (the sandbox resumes the call's stream with Last-Event-ID): the call
// runs on, bounded by the upstream's call_timeout, until it is answered, cancelled
// (notifications/cancelled) or its session ends. On 2026-07-28 closing the stream cancels it.
func (x *exchange) callContext(ctx context.Context) (context.Context, func()) {
	if x.session == nil || x.msg.ID == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopSession := context.AfterFunc(x.session.ctx, cancel)
	forget := x.session.cancellable(x.msg.ID, cancel)
	done := x.session.running(x.out)
	return ctx, func() {
		done()
		forget()
		stopSession()
		cancel()
	}
}

// send sends the request to x.up and returns its result as the upstream wrote it: on the
// connection of the sandbox's upstream session (upstream_sessions.go), what the upstream sends
// about it routed to the request's stream (bridge.go), an upstream of 2026-07-28 asking a
// legacy sandbox for input asked through its stream (roundtrip.go).
func (x *exchange) send(ctx context.Context, params relayed) (json.RawMessage, error) {
	ctx, c, token := x.g.inflight.begin(ctx, x, x.up)
	defer x.g.inflight.end(x.up, c)
	params.token = token
	return do(ctx, x.up, func(ctx context.Context, cli *client.Client) (json.RawMessage, error) {
		p := x.ownToken(params, c, cli)
		x.upModern = mcp.IsModernProtocol(cli.ProtocolVersion())
		if !x.modern && x.upModern {
			return roundTrip(ctx, cli, x.msg.Method, p)
		}
		return rpc(ctx, cli, x.msg.Method, p)
	})
}

// ownToken is params as sent on connection cli for call c: on the sandbox's own upstream
// session, its own progress token, as a direct client's; on the shared one, Sandgate's.
func (x *exchange) ownToken(params relayed, c *inflightCall, cli *client.Client) relayed {
	if params.token != "" && !x.up.isShared(cli) {
		params.token, params.own = "", x.meta.progressToken
		x.g.inflight.alias(x.up, c, x.caller().sessionKey(), params.own)
	}
	return params
}

// answerWith answers the request with the upstream's result (res) or its failure (err).
func (x *exchange) answerWith(res json.RawMessage, err error) (response, call.End) {
	if err != nil {
		return x.upstreamFailed(err)
	}
	out, isError, err := x.adaptResult(res)
	if err != nil {
		return x.failed(call.Refuse(call.CodeUpstreamError, "upstream %s answered a result that is not a JSON object", x.up.cfg.Name))
	}
	if isError {
		x.cl.Note("tool_error_result")
	}
	if x.modern && mrtrMethods[x.msg.Method] && bytes.Contains(out, []byte(`"input_required"`)) {
		out = x.sealInputRequired(out)
	}
	if x.msg.Method == string(mcp.MethodToolsCall) && !x.madeTask(out) {
		return x.failed(call.Refuse(call.CodeUpstreamError, "upstream %s answered with a task the sandbox did not declare it takes", x.up.cfg.Name))
	}
	return x.respond(x.result(out)), call.Answered(http.StatusOK)
}

// upstreamFailed answers a request the upstream failed: an error it answered is relayed as it
// wrote it; a failure of Sandgate's reaching it is said in Sandgate's own words (a closed set:
// failures.go), the detail in the event only.
func (x *exchange) upstreamFailed(err error) (response, call.End) {
	var re *replyError
	if errors.As(err, &re) {
		detail, echoed := x.g.guard.Current().ScrubString(string(re.raw))
		if echoed {
			x.cl.CredentialEchoed()
		}
		rf := call.Refuse(call.CodeUpstreamError, "upstream %s answered an error", x.up.cfg.Name)
		rf.Detail = detail
		return x.respond(x.errorResponse(re.raw)), call.Failed(rf)
	}
	return x.failed(x.failure(err))
}

// failed ends the request with rf, an allowed request that could not be done, answered in its
// method's shape: a tool's error result, or a JSON-RPC error.
func (x *exchange) failed(rf *call.Refusal) (response, call.End) {
	if x.msg.Method == string(mcp.MethodToolsCall) {
		return x.respond(x.result(toolError(rf.Reason))), call.Failed(rf)
	}
	return x.respond(x.rpcError(codeInternalError, rf.Reason, refusalData{Code: rf.Code})), call.Failed(rf)
}

// toolRefused answers a refused tools/call: a tool the caller cannot see (or that does not
// exist) as invalid params, anything else as a tool error result carrying the refusal's reason,
// so that the agent can adapt.
func toolRefused(x *exchange, rf *call.Refusal) []byte {
	if rf.Code == call.CodeNotFound || x.gone && rf.Class() == call.ClassPolicy {
		return x.rpcError(codeInvalidParams, "tool '"+truncate(jsonscan.String(x.msg.p.name), 100)+"' not found", nil)
	}
	prefix := "denied by Sandgate policy: "
	if rf.Code == call.CodeBadParams {
		prefix = "refused by Sandgate: "
	}
	return x.result(toolError(prefix + rf.Reason))
}

// toolError is a tool's error result carrying text.
func toolError(text string) []byte {
	b := append([]byte(`{"content":[{"type":"text","text":`), jsonenc.AppendString(nil, text)...)
	return append(b, `}],"isError":true}`...)
}

// errorResponse is the response to the request carrying err, a JSON-RPC error object as written.
func (x *exchange) errorResponse(err json.RawMessage) []byte {
	b := append(append([]byte(`{"jsonrpc":"2.0","id":`), x.msg.ID...), `,"error":`...)
	return append(append(b, err...), '}')
}
