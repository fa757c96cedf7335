package gateway

import (
	"context"
	"fmt"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/policy"
)

// completions forwards completion/complete for a prompt the caller may get or a resource
// template it may read. The request's call (mcp.completion) carries the decision, made on the
// kind of what is completed, without counting it against budgets.
type completions struct{ g *Gateway }

func (c completions) CompletePromptArgument(ctx context.Context, name string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	n, ok := c.g.prompt(name)
	if !ok || !c.decide(ctx, audit.KindPromptsGet, n.upstream, n.name) {
		return nil, fmt.Errorf("prompt %q: %w", name, server.ErrPromptNotFound)
	}
	req := mcp.CompleteRequest{}
	req.Params.Ref = mcp.PromptReference{Type: "ref/prompt", Name: n.name}
	req.Params.Argument, req.Params.Context = arg, cc
	return c.forward(ctx, n.upstream, req)
}

func (c completions) CompleteResourceArgument(ctx context.Context, uri string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	up := c.g.templateUpstream(uri)
	if up == nil {
		var ok bool
		if up, ok = c.g.resourceUpstream(uri); !ok {
			return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
		}
	}
	if !c.decide(ctx, audit.KindResourcesRead, up, uri) {
		return nil, fmt.Errorf("resource %q: %w", uri, server.ErrResourceNotFound)
	}
	req := mcp.CompleteRequest{}
	req.Params.Ref = mcp.ResourceReference{Type: "ref/resource", URI: uri}
	req.Params.Argument, req.Params.Context = arg, cc
	return c.forward(ctx, up, req)
}

// decide records the decision on the request's call (or asks policy alone when there is none).
func (c completions) decide(ctx context.Context, kind audit.Kind, u *upstream, name string) bool {
	cl := call.From(ctx)
	if cl == nil {
		return c.g.visible(ctx, kind, u.cfg.Name, name)
	}
	cl.Describe(audit.Target{Upstream: u.cfg.Name, Tool: name})
	in := &policy.Input{Kind: kind, Identity: cl.Identity(), MCP: &policy.MCP{Upstream: u.cfg.Name, Tool: name}}
	_, rf := cl.Authorize(ctx, in, false)
	if rf != nil {
		cl.Refuse(rf)
	}
	return rf == nil
}

func (c completions) forward(ctx context.Context, u *upstream, req mcp.CompleteRequest) (*mcp.Completion, error) {
	res, err := do(ctx, u, func(ctx context.Context, cl *client.Client) (*mcp.CompleteResult, error) {
		return request(ctx, cl, mcp.MethodCompletionComplete, req.Params, keptWhole(ctx, parseJSON[mcp.CompleteResult]))
	})
	if err != nil {
		return nil, u.fail(call.From(ctx), failureCode(err), err)
	}
	return &res.Completion, nil
}

// templateUpstream is the upstream whose resource template is raw, or nil.
func (g *Gateway) templateUpstream(raw string) *upstream {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, e := range g.templates {
		if e.tmpl.URITemplate != nil && e.tmpl.URITemplate.Raw() == raw {
			return e.upstream
		}
	}
	return nil
}
