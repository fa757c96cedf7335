package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// reasonAuditDown is the denial reason while the audit log cannot be written (fail closed).
const reasonAuditDown = "audit log unavailable"

type identityKey struct{}

// requestContext puts the caller's identity, resolved from the TCP peer address only, into
// the request's context. No header is read. A session continued from another replica gets its
// client's info back here.
func (g *Gateway) requestContext(ctx context.Context, r *http.Request) context.Context {
	g.sessions.restore(ctx)
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
	hooks.AddAfterListResources(g.afterListResources)
	hooks.AddAfterListResourceTemplates(g.afterListTemplates)
	hooks.AddOnError(g.onError)
	hooks.AddAfterSubscribe(g.afterSubscribe)
	hooks.AddAfterUnsubscribe(g.afterUnsubscribe)
	hooks.AddAfterInitialize(func(ctx context.Context, _ any, req *mcp.InitializeRequest, res *mcp.InitializeResult) {
		if s := server.ClientSessionFromContext(ctx); s != nil {
			g.sessions.initialized(ctx, s.SessionID(), req, res)
		}
	})
	return server.NewMCPServer("sandgate", "1",
		server.WithToolCapabilities(true),
		server.WithResourceCapabilities(true, true),
		server.WithPromptCapabilities(true),
		server.WithLogging(),
		server.WithCompletions(),
		server.WithElicitation(),
		server.WithRoots(),
		server.WithToolFilter(g.visibleTools),
		server.WithPromptFilter(g.visiblePrompts),
		server.WithPromptCompletionProvider(completions{g}),
		server.WithResourceCompletionProvider(completions{g}),
		server.WithHooks(hooks),
		server.WithRecovery(),
	)
}

// decide asks policy whether the caller may see something (a list entry, a completion); the
// call is not counted against its limits and input carries no usage or grants.
func (g *Gateway) decide(ctx context.Context, kind, upstream, name string, args map[string]any) policy.Decision {
	d, _ := g.evaluate(ctx, kind, upstream, name, args, false)
	return d
}

// decideCall asks policy about a call that is about to happen (tools/call, resources/read,
// prompts/get): it is counted against the caller's budgets first, and input carries its usage
// and grants. limited reports a refusal by a limit rather than by policy.
func (g *Gateway) decideCall(ctx context.Context, kind, upstream, name string, args map[string]any) (d policy.Decision, limited bool) {
	return g.evaluate(ctx, kind, upstream, name, args, true)
}

// evaluate is the one place the gateway builds the policy input and asks policy. While the
// audit log is unhealthy every call is denied: nothing happens that cannot be recorded.
func (g *Gateway) evaluate(ctx context.Context, kind, upstream, name string, args map[string]any, admit bool) (policy.Decision, bool) {
	if err := g.opts.Audit.Healthy(); err != nil && kind != policy.KindToolsList {
		return policy.Decision{Reason: reasonAuditDown, Code: "audit_unavailable"}, false
	}
	in := &policy.Input{Kind: kind, Identity: identityFrom(ctx),
		MCP: &policy.MCP{Upstream: upstream, Tool: name, Arguments: args}}
	if admit {
		if deny := g.opts.Admission.Admit(ctx, in); deny != nil {
			return *deny, true
		}
	}
	return g.opts.Policy.Decide(ctx, in), false
}

// visibleTools keeps the tools policy lets the caller see (mcp.tools_list). mcp-go applies it
// to tools/list and to tools/call, so a hidden tool answers exactly like an unknown one.
func (g *Gateway) visibleTools(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	out := tools[:0:0]
	for _, t := range tools {
		n, ok := g.tool(t.Name)
		if ok && g.decide(ctx, policy.KindToolsList, n.upstream.cfg.Name, n.name, nil).Allow {
			out = append(out, t)
		}
	}
	return out
}

func (g *Gateway) visiblePrompts(ctx context.Context, prompts []mcp.Prompt) []mcp.Prompt {
	out := prompts[:0:0]
	for _, p := range prompts {
		n, ok := g.prompt(p.Name)
		if ok && g.decide(ctx, policy.KindPromptsGet, n.upstream.cfg.Name, n.name, nil).Allow {
			out = append(out, p)
		}
	}
	return out
}

func (g *Gateway) resourceVisible(ctx context.Context, uri string) bool {
	u, ok := g.resourceUpstream(uri)
	return ok && g.decide(ctx, policy.KindResourcesRead, u.cfg.Name, uri, nil).Allow
}

// afterListTools writes the one audit event of a tools/list.
func (g *Gateway) afterListTools(ctx context.Context, _ any, _ *mcp.ListToolsRequest, res *mcp.ListToolsResult) {
	total, _ := g.counts()
	shown := len(res.Tools)
	hidden := max(total-shown, 0)
	g.record(ctx, &audit.Event{Kind: audit.KindToolsList, Target: audit.Target{Shown: &shown, Hidden: &hidden},
		Decision: audit.Decision{Allow: true, Reason: "listed"}}, time.Now())
}

func (g *Gateway) afterListResources(ctx context.Context, _ any, _ *mcp.ListResourcesRequest, res *mcp.ListResourcesResult) {
	kept := res.Resources[:0]
	for _, r := range res.Resources {
		if g.resourceVisible(ctx, r.URI) {
			kept = append(kept, r)
		}
	}
	res.Resources = kept
}

func (g *Gateway) afterListTemplates(ctx context.Context, _ any, _ *mcp.ListResourceTemplatesRequest, res *mcp.ListResourceTemplatesResult) {
	kept := res.ResourceTemplates[:0]
	for _, t := range res.ResourceTemplates {
		raw := ""
		if t.URITemplate != nil {
			raw = t.URITemplate.Raw()
		}
		g.mu.RLock()
		var up *upstream
		for _, e := range g.templates {
			if e.tmpl.URITemplate != nil && e.tmpl.URITemplate.Raw() == raw {
				up = e.upstream
				break
			}
		}
		g.mu.RUnlock()
		if up != nil && g.decide(ctx, policy.KindResourcesRead, up.cfg.Name, raw, nil).Allow {
			kept = append(kept, t)
		}
	}
	res.ResourceTemplates = kept
}

// onError audits calls that mcp-go refused before a handler ran: an unknown or hidden tool,
// prompt or resource. They are denials like any other.
func (g *Gateway) onError(ctx context.Context, _ any, method mcp.MCPMethod, msg any, err error) {
	var kind, name string
	switch method {
	case mcp.MethodToolsCall:
		if !errors.Is(err, server.ErrToolNotFound) {
			return
		}
		kind = audit.KindToolsCall
		if r, ok := msg.(*mcp.CallToolRequest); ok {
			name = r.Params.Name
		}
	case mcp.MethodPromptsGet:
		if !errors.Is(err, server.ErrPromptNotFound) {
			return
		}
		kind = audit.KindPromptsGet
		if r, ok := msg.(*mcp.GetPromptRequest); ok {
			name = r.Params.Name
		}
	case mcp.MethodResourcesRead:
		if !errors.Is(err, server.ErrResourceNotFound) {
			return
		}
		kind = audit.KindResourcesRead
		if r, ok := msg.(*mcp.ReadResourceRequest); ok {
			name = r.Params.URI
		}
	default:
		return
	}
	g.record(ctx, &audit.Event{Kind: kind, Target: audit.Target{Tool: name},
		Decision: audit.Decision{Allow: false, Reason: "not found or not visible to the caller"},
		Outcome:  audit.Outcome{Error: "not found"}}, time.Now())
}

// callTool authorizes one tools/call with its arguments (mcp.tools_call), forwards it, and
// writes exactly one audit event. A denied call is a tool error result carrying the policy's
// reason, so the agent can adapt.
func (g *Gateway) callTool(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	start := time.Now()
	ctx, span := g.startSpan(ctx, "tools/call")
	defer span.End()
	n, ok := g.tool(req.Params.Name)
	if !ok { // removed between mcp-go's lookup and here
		return nil, fmt.Errorf("tool '%s' not found: %w", req.Params.Name, server.ErrToolNotFound)
	}
	args := req.GetArguments()
	ev := &audit.Event{Kind: audit.KindToolsCall,
		Target: audit.Target{Upstream: n.upstream.cfg.Name, Tool: n.name, ArgsSHA256: argsHash(req.Params.Arguments)}}
	d, limited := g.decideCall(ctx, policy.KindToolsCall, n.upstream.cfg.Name, n.name, args)
	spanDecision(ctx, d)
	ev.Decision = audit.Decision{Allow: d.Allow, Reason: d.Reason, PolicyRevision: d.Revision}
	if !d.Allow {
		ev.Outcome.Status = 403
		if limited {
			ev.Outcome.Status, ev.Outcome.Error = 429, d.Code
		}
		g.record(ctx, ev, start)
		return mcp.NewToolResultError("denied by Sandgate policy: " + d.Reason), nil
	}
	release, deny := g.opts.Admission.AcquireToolCall(ctx, identityFrom(ctx))
	defer release()
	if deny != nil {
		ev.Decision.Allow, ev.Decision.Reason = false, deny.Reason
		ev.Outcome.Status, ev.Outcome.Error = 429, deny.Code
		g.record(ctx, ev, start)
		return mcp.NewToolResultError("denied by Sandgate policy: " + deny.Reason), nil
	}
	if n.upstream.cfg.Credential != nil {
		ev.Credential = n.upstream.cfg.Credential.Name
	}
	// A fresh request: nothing of the sandbox's HTTP request (headers, Authorization) travels on.
	out := mcp.CallToolRequest{}
	out.Params.Name = n.name
	out.Params.Arguments = req.Params.Arguments
	out.Params.Meta = g.inflight.begin(ctx, n.upstream, req.Params.Meta)
	defer g.inflight.end(n.upstream, out.Params.Meta)
	res, err := do(ctx, n.upstream, func(ctx context.Context, c *client.Client) (*mcp.CallToolResult, error) {
		return c.CallTool(ctx, out)
	})
	if err != nil {
		ev.Outcome.Status, ev.Outcome.Error = 502, err.Error()
		g.record(ctx, ev, start)
		return mcp.NewToolResultError(fmt.Sprintf("upstream %s failed: %v", n.upstream.cfg.Name, err)), nil
	}
	ev.Outcome.Status = 200
	if res.IsError {
		ev.Outcome.Error = "tool returned an error result"
	}
	g.record(ctx, ev, start)
	return res, nil
}

// readResource authorizes and forwards resources/read (mcp.resources_read, URI in input.mcp.tool).
// A URI the caller may not read answers like an unknown one.
func (g *Gateway) readResource(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	start := time.Now()
	ctx, span := g.startSpan(ctx, "resources/read")
	defer span.End()
	uri := req.Params.URI
	u, ok := g.resourceUpstream(uri)
	if !ok {
		return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
	}
	ev := &audit.Event{Kind: audit.KindResourcesRead, Target: audit.Target{Upstream: u.cfg.Name, Tool: uri}}
	d, limited := g.decideCall(ctx, policy.KindResourcesRead, u.cfg.Name, uri, nil)
	spanDecision(ctx, d)
	ev.Decision = audit.Decision{Allow: d.Allow, Reason: d.Reason, PolicyRevision: d.Revision}
	if limited {
		ev.Outcome.Status, ev.Outcome.Error = 429, d.Code
		g.record(ctx, ev, start)
		return nil, fmt.Errorf("resource %q denied by Sandgate: %s", uri, d.Reason)
	}
	if !d.Allow {
		ev.Outcome.Status = 404
		g.record(ctx, ev, start)
		return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
	}
	out := mcp.ReadResourceRequest{}
	out.Params.URI = uri
	out.Params.Arguments = req.Params.Arguments
	res, err := do(ctx, u, func(ctx context.Context, c *client.Client) (*mcp.ReadResourceResult, error) {
		return c.ReadResource(ctx, out)
	})
	if err != nil {
		ev.Outcome.Status, ev.Outcome.Error = 502, err.Error()
		g.record(ctx, ev, start)
		return nil, fmt.Errorf("upstream %s: %w", u.cfg.Name, err)
	}
	ev.Outcome.Status = 200
	g.record(ctx, ev, start)
	return res.Contents, nil
}

// getPrompt authorizes and forwards prompts/get (mcp.prompts_get, prompt name in input.mcp.tool).
func (g *Gateway) getPrompt(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	start := time.Now()
	ctx, span := g.startSpan(ctx, "prompts/get")
	defer span.End()
	n, ok := g.prompt(req.Params.Name)
	if !ok {
		return nil, fmt.Errorf("prompt %q: %w", req.Params.Name, server.ErrPromptNotFound)
	}
	args := make(map[string]any, len(req.Params.Arguments))
	for k, v := range req.Params.Arguments {
		args[k] = v
	}
	ev := &audit.Event{Kind: audit.KindPromptsGet, Target: audit.Target{Upstream: n.upstream.cfg.Name, Tool: n.name}}
	d, limited := g.decideCall(ctx, policy.KindPromptsGet, n.upstream.cfg.Name, n.name, args)
	spanDecision(ctx, d)
	ev.Decision = audit.Decision{Allow: d.Allow, Reason: d.Reason, PolicyRevision: d.Revision}
	if !d.Allow {
		ev.Outcome.Status = 403
		if limited {
			ev.Outcome.Status, ev.Outcome.Error = 429, d.Code
		}
		g.record(ctx, ev, start)
		return nil, fmt.Errorf("prompt %q denied by Sandgate policy: %s", req.Params.Name, d.Reason)
	}
	out := mcp.GetPromptRequest{}
	out.Params.Name = n.name
	out.Params.Arguments = req.Params.Arguments
	res, err := do(ctx, n.upstream, func(ctx context.Context, c *client.Client) (*mcp.GetPromptResult, error) {
		return c.GetPrompt(ctx, out)
	})
	if err != nil {
		ev.Outcome.Status, ev.Outcome.Error = 502, err.Error()
		g.record(ctx, ev, start)
		return nil, fmt.Errorf("upstream %s: %w", n.upstream.cfg.Name, err)
	}
	ev.Outcome.Status = 200
	g.record(ctx, ev, start)
	return res, nil
}

// completions forwards completion/complete for a visible prompt or readable template.
type completions struct{ g *Gateway }

func (c completions) CompletePromptArgument(ctx context.Context, name string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	n, ok := c.g.prompt(name)
	if !ok || !c.g.decide(ctx, policy.KindPromptsGet, n.upstream.cfg.Name, n.name, nil).Allow {
		return nil, fmt.Errorf("prompt %q: %w", name, server.ErrPromptNotFound)
	}
	req := mcp.CompleteRequest{}
	req.Params.Ref = mcp.PromptReference{Type: "ref/prompt", Name: n.name}
	req.Params.Argument, req.Params.Context = arg, cc
	return c.forward(ctx, n.upstream, req)
}

func (c completions) CompleteResourceArgument(ctx context.Context, uri string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	var up *upstream
	c.g.mu.RLock()
	for _, e := range c.g.templates {
		if e.tmpl.URITemplate != nil && e.tmpl.URITemplate.Raw() == uri {
			up = e.upstream
		}
	}
	c.g.mu.RUnlock()
	if up == nil {
		var ok bool
		if up, ok = c.g.resourceUpstream(uri); !ok {
			return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
		}
	}
	if !c.g.decide(ctx, policy.KindResourcesRead, up.cfg.Name, uri, nil).Allow {
		return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
	}
	req := mcp.CompleteRequest{}
	req.Params.Ref = mcp.ResourceReference{Type: "ref/resource", URI: uri}
	req.Params.Argument, req.Params.Context = arg, cc
	return c.forward(ctx, up, req)
}

func (c completions) forward(ctx context.Context, u *upstream, req mcp.CompleteRequest) (*mcp.Completion, error) {
	res, err := do(ctx, u, func(ctx context.Context, cl *client.Client) (*mcp.CompleteResult, error) {
		return cl.Complete(ctx, req)
	})
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", u.cfg.Name, err)
	}
	return &res.Completion, nil
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
