package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

type identityKey struct{}

// requestContext puts the caller's identity, resolved from the TCP peer address only, into
// the request's context. No header is read. A session continued from another replica gets its
// client's info back here.
func (g *Gateway) requestContext(ctx context.Context, r *http.Request) context.Context {
	if s := server.ClientSessionFromContext(ctx); s != nil && s.SessionID() != "" {
		if ss := g.sandboxes.get(s.SessionID()); ss != nil {
			ss.restore(s)
		}
	}
	if cl := call.From(ctx); cl != nil {
		return context.WithValue(ctx, identityKey{}, cl.Identity())
	}
	return context.WithValue(ctx, identityKey{}, identity.FromRemoteAddr(g.opts.Identity, r.RemoteAddr))
}

func identityFrom(ctx context.Context) identity.Identity {
	id, _ := ctx.Value(identityKey{}).(identity.Identity)
	return id
}

// newMCPServer is the sandbox-facing MCP server: the aggregated catalog, filtered per caller.
func (g *Gateway) newMCPServer() *server.MCPServer {
	hooks := &server.Hooks{}
	hooks.AddAfterListTools(g.afterListTools)
	hooks.AddAfterListPrompts(g.afterListPrompts)
	hooks.AddAfterListResources(g.afterListResources)
	hooks.AddAfterListResourceTemplates(g.afterListTemplates)
	hooks.AddOnError(g.onError)
	hooks.AddAfterSubscribe(g.afterSubscribe)
	hooks.AddAfterUnsubscribe(g.afterUnsubscribe)
	hooks.AddAfterInitialize(func(ctx context.Context, _ any, req *mcp.InitializeRequest, res *mcp.InitializeResult) {
		if s := server.ClientSessionFromContext(ctx); s != nil && s.SessionID() != "" {
			// Registered with mcp-go before it registers a session of its own (sandboxes.go).
			ss := g.sandboxes.open(ctx, s.SessionID())
			ss.initialized(req.Params.ClientInfo, req.Params.Capabilities, res.ProtocolVersion)
			ss.seen(identityFrom(ctx))
			g.sessions.initialized(ctx, s.SessionID(), req, res)
		}
	})
	hooks.AddAfterSetLevel(func(ctx context.Context, _ any, req *mcp.SetLevelRequest, _ *mcp.EmptyResult) {
		if s := server.ClientSessionFromContext(ctx); s != nil {
			if ss := g.sandboxes.get(s.SessionID()); ss != nil {
				ss.setLevel(req.Params.Level)
			}
		}
	})
	return server.NewMCPServer("sandgate", "1",
		server.WithToolCapabilities(true),
		server.WithResourceCapabilities(true, true),
		server.WithPromptCapabilities(true),
		server.WithLogging(),
		server.WithCompletions(),
		// No WithElicitation or WithRoots: those are client capabilities; an upstream's requests
		// for them are passed on by the gateway itself (route.go), not through mcp-go.
		server.WithToolFilter(g.visibleTools),
		server.WithPromptFilter(g.visiblePrompts),
		server.WithPromptCompletionProvider(completions{g}),
		server.WithResourceCompletionProvider(completions{g}),
		server.WithHooks(hooks),
		server.WithRecovery(),
	)
}

// visible asks policy whether the caller may see something (a list entry, a completion
// target). Nothing is counted and no event is written: the request that asked has its own.
func (g *Gateway) visible(ctx context.Context, kind audit.Kind, upstream, name string) bool {
	in := &policy.Input{Kind: kind, Identity: identityFrom(ctx), MCP: &policy.MCP{Upstream: upstream, Tool: name}}
	return g.core.Decide(ctx, in).Allow
}

// visibleTools keeps the tools policy lets the caller see (mcp.tools_list). mcp-go applies it
// to tools/list and to tools/call, so a hidden tool answers exactly like an unknown one.
//
// A tool the upstream lists only to clients with a capability the sandbox did not declare is
// not shown either (capabilities.go).
//
// The tools are copied only from the first one hidden on: mcp-go checks each tools/call with a
// list of one, and a copy of that tool was ~400 B of every call.
func (g *Gateway) visibleTools(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	capable := g.capabilityOf(ctx)
	var out []mcp.Tool
	for i, t := range tools {
		n, ok := g.tool(t.Name)
		shown := ok && g.visible(ctx, audit.KindToolsList, n.upstream.cfg.Name, n.name) && capable.allows(n.upstream, n.name)
		switch {
		case !shown && out == nil:
			out = append(make([]mcp.Tool, 0, len(tools)-1), tools[:i]...)
		case shown && out != nil:
			out = append(out, t)
		}
	}
	if out == nil {
		return tools // all shown
	}
	return out
}

func (g *Gateway) visiblePrompts(ctx context.Context, prompts []mcp.Prompt) []mcp.Prompt {
	out := prompts[:0:0]
	for _, p := range prompts {
		n, ok := g.prompt(p.Name)
		if ok && g.visible(ctx, audit.KindPromptsGet, n.upstream.cfg.Name, n.name) {
			out = append(out, p)
		}
	}
	return out
}

// readable decides a resources/read in full (admission included) before mcp-go sees it, so
// that a URI the caller may not read and a URI that does not exist get the same answer from
// the same place (guard). The decision stays on cl; readResource then only forwards.
func (g *Gateway) readable(ctx context.Context, cl *call.Call, uri string) bool {
	u, ok := g.resourceUpstream(uri)
	cl.Describe(audit.Target{Tool: uri})
	if !ok {
		cl.Refuse(call.Refuse(call.CodeNotFound, "resource not found"))
		return false
	}
	a := action{kind: audit.KindResourcesRead, upstream: u, name: uri}
	if rf := g.authorize(ctx, cl, a); rf != nil {
		cl.Hide(rf) // the event keeps policy's reason and code; the sandbox sees "not found"
		return false
	}
	return true
}

// counted sets the list call's shown and hidden counts.
func counted(ctx context.Context, shown, total int) {
	if cl := call.From(ctx); cl != nil {
		hidden := max(total-shown, 0)
		cl.Describe(audit.Target{Shown: &shown, Hidden: &hidden})
	}
}

func (g *Gateway) afterListTools(ctx context.Context, _ any, _ *mcp.ListToolsRequest, res *mcp.ListToolsResult) {
	total, _ := g.counts()
	counted(ctx, len(res.Tools), total)
	names := make([]string, 0, len(res.Tools))
	for _, t := range res.Tools {
		names = append(names, t.Name)
	}
	g.listed(ctx, mcp.MethodToolsList, names)
}

func (g *Gateway) afterListPrompts(ctx context.Context, _ any, _ *mcp.ListPromptsRequest, res *mcp.ListPromptsResult) {
	_, total := g.counts()
	counted(ctx, len(res.Prompts), total)
	names := make([]string, 0, len(res.Prompts))
	for _, p := range res.Prompts {
		names = append(names, p.Name)
	}
	g.listed(ctx, mcp.MethodPromptsList, names)
}

func (g *Gateway) afterListResources(ctx context.Context, _ any, _ *mcp.ListResourcesRequest, res *mcp.ListResourcesResult) {
	total := len(res.Resources)
	kept := res.Resources[:0]
	for _, r := range res.Resources {
		if u, ok := g.resourceUpstream(r.URI); ok && g.visible(ctx, audit.KindResourcesRead, u.cfg.Name, r.URI) {
			kept = append(kept, r)
		}
	}
	res.Resources = kept
	counted(ctx, len(kept), total)
	names := make([]string, 0, len(kept))
	for _, r := range kept {
		names = append(names, r.URI)
	}
	g.listed(ctx, mcp.MethodResourcesList, names)
}

func (g *Gateway) afterListTemplates(ctx context.Context, _ any, _ *mcp.ListResourceTemplatesRequest, res *mcp.ListResourceTemplatesResult) {
	total := len(res.ResourceTemplates)
	kept := res.ResourceTemplates[:0]
	for _, t := range res.ResourceTemplates {
		raw := ""
		if t.URITemplate != nil {
			raw = t.URITemplate.Raw()
		}
		if up := g.templateUpstream(raw); up != nil && g.visible(ctx, audit.KindResourcesRead, up.cfg.Name, raw) {
			kept = append(kept, t)
		}
	}
	res.ResourceTemplates = kept
	counted(ctx, len(kept), total)
	names := make([]string, 0, len(kept))
	for _, t := range kept {
		if t.URITemplate != nil {
			names = append(names, t.URITemplate.Raw())
		}
	}
	g.listed(ctx, mcp.MethodResourcesTemplatesList, names)
}

// onError records on the request's call what mcp-go refused before a handler ran: an unknown
// or hidden tool or prompt is a denial like any other; a handler's error is the call's error.
func (g *Gateway) onError(ctx context.Context, _ any, method mcp.MCPMethod, msg any, err error) {
	cl := call.From(ctx)
	if cl == nil || cl.OutcomeError() != "" {
		return
	}
	switch {
	case errors.Is(err, server.ErrToolNotFound) || errors.Is(err, server.ErrPromptNotFound) || errors.Is(err, server.ErrResourceNotFound):
		if r, ok := msg.(*mcp.CallToolRequest); ok {
			cl.Describe(audit.Target{Tool: r.Params.Name})
		}
		if r, ok := msg.(*mcp.GetPromptRequest); ok {
			cl.Describe(audit.Target{Tool: r.Params.Name})
		}
		// mcp-go answers it; the call ends when the guard's handler returns.
		cl.NoteRefusal(call.Refuse(call.CodeNotFound, "not found or not visible to the caller"))
	default:
		// An upstream's error text may echo its credential: the event never holds it.
		text, _ := g.guard.Current().ScrubString(err.Error())
		cl.Note(string(method) + ": " + truncate(text, 200))
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// action is one call that reaches one upstream: tools/call, resources/read or prompts/get.
type action struct {
	kind     audit.Kind
	upstream *upstream
	name     string // the upstream's name of the tool or prompt, or the resource URI
	args     map[string]any
	rawArgs  any // the arguments as sent, for the audit event's hash
}

// authorize is the gateway's shape of the request path's decision step for a: the target on
// the event, call.Authorize with admission, then the credential step both halves share
// (call.TakeCredential). The value is not kept: the upstream's transport reads it for each
// request (headers), so a rotated credential applies at once. On a refusal the caller ends the
// call (Refuse, or Hide where a refusal must look like absence).
func (g *Gateway) authorize(ctx context.Context, cl *call.Call, a action) *call.Refusal {
	t := audit.Target{Upstream: a.upstream.cfg.Name, Tool: a.name}
	if a.rawArgs != nil {
		t.ArgsSHA256 = argsHash(a.rawArgs)
	}
	cl.Describe(t)
	in := &policy.Input{Kind: a.kind, Identity: cl.Identity(),
		MCP: &policy.MCP{Upstream: a.upstream.cfg.Name, Tool: a.name, Arguments: a.args}}
	d, rf := cl.Authorize(ctx, in, true)
	if rf != nil {
		return rf
	}
	configured := ""
	if c := a.upstream.cfg.Credential; c != nil {
		configured = c.Name
	}
	_, rf = cl.TakeCredential(g.opts.Credentials, configured, d.Credential)
	return rf
}

// forward sends an authorized call to its upstream and ends the call with the outcome.
func forward[R any](ctx context.Context, cl *call.Call, u *upstream, send func(context.Context, *client.Client) (R, error)) (R, error) {
	res, err := do(ctx, u, send)
	if errors.Is(err, errUpstreamDown) || errors.Is(err, errBreakerOpen) {
		// A down upstream, or one whose breaker is open, keeps its tools in the catalog: its
		// calls answer "unavailable" (503), audited as such, never as hidden or missing.
		return res, u.fail(cl, call.CodeUpstreamUnavailable, err)
	}
	if err != nil {
		return res, u.fail(cl, failureCode(err), err)
	}
	cl.Answered(http.StatusOK)
	return res, nil
}

// callFrom is the request's call, begun by the guard; a handler run without one (in-process
// use) begins and ends its own.
func (g *Gateway) callFrom(ctx context.Context, kind audit.Kind) (context.Context, *call.Call, func()) {
	if cl := call.From(ctx); cl != nil {
		return ctx, cl, func() {}
	}
	ctx, cl := g.core.Begin(ctx, kind, identityFrom(ctx))
	return ctx, cl, cl.Finish
}

// callTool authorizes one tools/call with its arguments (mcp.tools_call) and forwards it. A
// refused call is a tool error result carrying the refusal's reason, so the agent can adapt.
func (g *Gateway) callTool(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	ctx, cl, end := g.callFrom(ctx, audit.KindToolsCall)
	defer end()
	n, ok := g.tool(req.Params.Name)
	if !ok { // removed between mcp-go's lookup and here
		return nil, fmt.Errorf("tool '%s' not found: %w", req.Params.Name, server.ErrToolNotFound)
	}
	args, err := policyArguments(req)
	if err != nil {
		rf := call.Refuse(call.CodeBadParams, "%v", err)
		cl.Describe(audit.Target{Upstream: n.upstream.cfg.Name, Tool: n.name})
		cl.Refuse(rf)
		return mcp.NewToolResultError("refused by Sandgate: " + rf.Reason), nil
	}
	a := action{kind: audit.KindToolsCall, upstream: n.upstream, name: n.name, args: args, rawArgs: req.Params.Arguments}
	if rf := g.authorize(ctx, cl, a); rf != nil {
		cl.Refuse(rf)
		return mcp.NewToolResultError("denied by Sandgate policy: " + rf.Reason), nil
	}
	release, deny := g.core.Admission().AcquireToolCall(ctx, cl.Identity())
	defer release()
	if deny != nil {
		rf := &call.Refusal{Code: string(deny.Code), Reason: deny.Reason, RetryAfter: deny.RetryAfter}
		cl.Refuse(rf)
		return mcp.NewToolResultError("denied by Sandgate policy: " + rf.Reason), nil
	}
	// A fresh request: nothing of the sandbox's HTTP request (headers, Authorization) travels on.
	out := mcp.CallToolRequest{}
	out.Params.Name = n.name
	// The arguments as the sandbox wrote them (RawArguments): decoded, numbers past 2^53 would
	// lose digits and keys their order.
	out.Params.Arguments, out.Params.RawArguments = req.Params.Arguments, req.Params.RawArguments
	ctx, c, meta := g.inflight.begin(ctx, n.upstream, req.Params.Meta)
	out.Params.Meta = meta
	defer g.inflight.end(n.upstream, c)
	res, err := forward(ctx, cl, n.upstream, func(ctx context.Context, c *client.Client) (*mcp.CallToolResult, error) {
		return request(ctx, c, mcp.MethodToolsCall, out.Params, toolResultFor(ctx))
	})
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	if res.IsError {
		cl.Note("tool_error_result")
	}
	return res, nil
}

// readResource forwards resources/read (mcp.resources_read, URI in input.mcp.tool); the guard
// decided it (readable).
func (g *Gateway) readResource(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	ctx, cl, end := g.callFrom(ctx, audit.KindResourcesRead)
	defer end()
	uri := req.Params.URI
	u, ok := g.resourceUpstream(uri)
	if !ok {
		return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
	}
	if cl.Target().Upstream == "" { // not decided by the guard (in-process use)
		if rf := g.authorize(ctx, cl, action{kind: audit.KindResourcesRead, upstream: u, name: uri}); rf != nil {
			cl.Hide(rf)
			return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
		}
	}
	out := mcp.ReadResourceRequest{}
	out.Params.URI = uri
	out.Params.Arguments = req.Params.Arguments
	res, err := forward(ctx, cl, u, func(ctx context.Context, c *client.Client) (*mcp.ReadResourceResult, error) {
		return request(ctx, c, mcp.MethodResourcesRead, out.Params, parseReadResult)
	})
	if err != nil {
		return nil, err
	}
	return res.Contents, nil
}

// getPrompt authorizes and forwards prompts/get (mcp.prompts_get, prompt name in input.mcp.tool).
func (g *Gateway) getPrompt(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	ctx, cl, end := g.callFrom(ctx, audit.KindPromptsGet)
	defer end()
	n, ok := g.prompt(req.Params.Name)
	if !ok {
		return nil, fmt.Errorf("prompt %q: %w", req.Params.Name, server.ErrPromptNotFound)
	}
	args := make(map[string]any, len(req.Params.Arguments))
	for k, v := range req.Params.Arguments {
		args[k] = v
	}
	if rf := g.authorize(ctx, cl, action{kind: audit.KindPromptsGet, upstream: n.upstream, name: n.name, args: args}); rf != nil {
		cl.Refuse(rf)
		return nil, fmt.Errorf("prompt %q denied by Sandgate: %s", req.Params.Name, rf.Reason)
	}
	out := mcp.GetPromptRequest{}
	out.Params.Name = n.name
	out.Params.Arguments = req.Params.Arguments
	return forward(ctx, cl, n.upstream, func(ctx context.Context, c *client.Client) (*mcp.GetPromptResult, error) {
		return request(ctx, c, mcp.MethodPromptsGet, out.Params, parsePromptResult)
	})
}

// argsHash is the SHA-256 of the call's arguments as JSON, for the audit event (the arguments
// themselves are not audited).
func argsHash(args any) string {
	b, err := json.Marshal(args)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
