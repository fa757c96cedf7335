package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonscan"
	"github.com/sandgate/sandgate/policy"
)

// The gateway writes each list a sandbox asks for itself, from the view (view.go): every entry
// of every upstream, as the upstream wrote it and in the upstreams' order, but those policy
// hides from the caller (mcp.tools_list, mcp.prompts_get, mcp.resources_read) and the tools
// an upstream lists only to clients with a capability the sandbox lacks (capabilities.go). A
// hidden entry is absent, as one that does not exist. The list result's _meta is that of the
// upstreams with an entry in it (the first upstream in config order winning a key both set);
// on 2026-07-28 the result is never to be shared across callers (cacheScope "private": what
// each sees is its own) and keeps the shortest ttlMs its upstreams gave (0 when none did). The
// whole list is one page.

// listActOf is the act of the list method of kind k.
func listActOf(k listKind) func(*exchange, context.Context, call.Grant) (response, call.End) {
	return func(x *exchange, ctx context.Context, _ call.Grant) (response, call.End) {
		if c := x.msg.p.cursor; c != nil && jsonscan.String(c) != "" {
			x.cl.Note("invalid_params")
			return x.respond(x.rpcError(codeInvalidParams, "invalid cursor: this list has one page", nil)), call.Answered(http.StatusOK)
		}
		return x.respondListed(x.result(x.g.listFor(ctx, x, k))), call.Answered(http.StatusOK)
	}
}

// listKindOf is the policy kind that decides whether an entry of a list is visible.
var listKindOf = map[mcp.MCPMethod]audit.Kind{
	mcp.MethodToolsList: audit.KindToolsList, mcp.MethodPromptsList: audit.KindPromptsGet,
	mcp.MethodResourcesList: audit.KindResourcesRead, mcp.MethodResourcesTemplatesList: audit.KindResourcesRead,
}

// listFor is the list result of kind k for the caller of x.
func (g *Gateway) listFor(ctx context.Context, x *exchange, k listKind) []byte {
	l := g.view.Load().list(k)
	who := x.caller()
	capable := g.capabilityOf(ctx, who)
	kind := listKindOf[k.method]
	out := make([]byte, 0, 1024)
	out = append(append(append(out, `{"`...), k.array...), `":[`...)
	shown := make([]string, 0, len(l.entries))
	from := make([]bool, len(l.metas))
	for _, e := range l.entries {
		if !g.visible(ctx, who, kind, e.up.cfg.Name, e.name) || (k == listTools && !capable.allows(e.up, e.name)) {
			continue
		}
		if len(shown) > 0 {
			out = append(out, ',')
		}
		out = append(out, e.raw...)
		shown = append(shown, e.id)
		from[e.from] = true
	}
	out = append(out, ']')
	if meta := mergedMeta(l.metas, from); meta != nil {
		out = append(append(out, `,"_meta":`...), meta...)
	}
	if x.modern {
		out = append(out, `,"resultType":"complete","cacheScope":"private","ttlMs":`...)
		out = strconv.AppendInt(out, shortestTTL(l.ttls, from), 10)
	}
	total := len(l.entries)
	hidden := total - len(shown)
	n := len(shown)
	x.cl.Describe(audit.Target{Shown: &n, Hidden: &hidden})
	g.listed(x.session, k.method, shown)
	return append(out, '}')
}

// visible asks policy whether who may see something (a list entry, a target). Nothing is
// counted and no event is written: the request that asked has its own.
func (g *Gateway) visible(ctx context.Context, who caller, kind audit.Kind, upstream, name string) bool {
	in := &policy.Input{Kind: kind, Identity: who.id, MCP: &policy.MCP{Upstream: upstream, Tool: name}}
	return g.core.Decide(ctx, in).Allow
}

// mergedMeta is the _meta of a list holding entries of the upstreams marked in from: theirs,
// merged in the upstreams' order (the first to set a key wins); nil when there is none.
func mergedMeta(metas []json.RawMessage, from []bool) json.RawMessage {
	merged := map[string]json.RawMessage{}
	for i, meta := range metas {
		var m map[string]json.RawMessage
		if !from[i] || meta == nil || json.Unmarshal(meta, &m) != nil {
			continue
		}
		for key, v := range m {
			if _, set := merged[key]; !set {
				merged[key] = v
			}
		}
	}
	if len(merged) == 0 {
		return nil
	}
	out, err := json.Marshal(merged)
	if err != nil {
		return nil
	}
	return out
}

// shortestTTL is the shortest ttlMs of the upstreams marked in from that gave one, 0 when none
// did.
func shortestTTL(ttls []int64, from []bool) int64 {
	best := int64(-1)
	for i, t := range ttls {
		if from[i] && t >= 0 && (best < 0 || t < best) {
			best = t
		}
	}
	return max(best, 0)
}
