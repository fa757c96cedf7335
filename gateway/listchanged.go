package gateway

import (
	"context"
	"maps"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
)

// A sandbox is told that a list changed (notifications/tools/list_changed and its kin, on its
// GET stream) when what it would be shown now differs from what it was shown when it last
// listed: an upstream's list changes that policy hides from it, or that need a capability it
// lacks, are no news to it. mcp-go's own list_changed, which it sends every session on every
// catalog update, is dropped (sandboxes.go). A sandbox that never listed is told nothing: it
// gets the new list when it lists.

// listChanges are the list kinds that can change, with their notification.
var listChanges = []struct {
	method       mcp.MCPMethod
	notification string
}{
	{mcp.MethodToolsList, mcp.MethodNotificationToolsListChanged},
	{mcp.MethodPromptsList, mcp.MethodNotificationPromptsListChanged},
	{mcp.MethodResourcesList, mcp.MethodNotificationResourcesListChanged},
	{mcp.MethodResourcesTemplatesList, mcp.MethodNotificationResourcesListChanged},
}

// listed records what a sandbox session was shown of a list.
func (g *Gateway) listed(ctx context.Context, method mcp.MCPMethod, names []string) {
	s := g.sessionOf(ctx)
	if s == nil {
		return
	}
	shown := make(map[string]bool, len(names))
	for _, n := range names {
		shown[n] = true
	}
	s.mu.Lock()
	if s.shown == nil {
		s.shown = map[mcp.MCPMethod]map[string]bool{}
	}
	s.shown[method] = shown
	s.mu.Unlock()
}

// tellListChanges tells each sandbox session whose visible lists changed since it listed them.
// The catalog's rebuild runs it, before the rebuild is over.
func (g *Gateway) tellListChanges() {
	for _, s := range g.sandboxes.all() {
		g.tellListChangesTo(s)
	}
}

// tellListChangesTo tells sandbox session s which of its visible lists changed since it listed
// them.
func (g *Gateway) tellListChangesTo(s *sandboxSession) {
	s.mu.Lock()
	shown := maps.Clone(s.shown)
	s.mu.Unlock()
	ctx := g.mcp.WithContext(context.WithValue(s.ctx, identityKey{}, s.identity()), s)
	told := map[string]bool{}
	for _, lc := range listChanges {
		before, ok := shown[lc.method]
		if !ok {
			continue
		}
		now := g.visibleNames(ctx, lc.method)
		if maps.Equal(before, now) {
			continue
		}
		s.mu.Lock()
		s.shown[lc.method] = now
		s.mu.Unlock()
		if !told[lc.notification] {
			told[lc.notification] = true
			s.stream.deliver(notificationBytes(lc.notification, nil))
		}
	}
}

// visibleNames is what the sandbox of ctx would be shown of a list now.
func (g *Gateway) visibleNames(ctx context.Context, method mcp.MCPMethod) map[string]bool {
	out := map[string]bool{}
	g.mu.RLock()
	tools, prompts := maps.Clone(g.tools), maps.Clone(g.prompts)
	resources := maps.Clone(g.resources)
	templates := append([]templateEntry(nil), g.templates...)
	g.mu.RUnlock()
	switch method {
	case mcp.MethodToolsList:
		capable := g.capabilityOf(ctx)
		for name, n := range tools {
			if g.visible(ctx, audit.KindToolsList, n.upstream.cfg.Name, n.name) && capable.allows(n.upstream, n.name) {
				out[name] = true
			}
		}
	case mcp.MethodPromptsList:
		for name, n := range prompts {
			if g.visible(ctx, audit.KindPromptsGet, n.upstream.cfg.Name, n.name) {
				out[name] = true
			}
		}
	case mcp.MethodResourcesList:
		for uri, u := range resources {
			if g.visible(ctx, audit.KindResourcesRead, u.cfg.Name, uri) {
				out[uri] = true
			}
		}
	case mcp.MethodResourcesTemplatesList:
		for _, t := range templates {
			if t.tmpl.URITemplate != nil && g.visible(ctx, audit.KindResourcesRead, t.upstream.cfg.Name, t.tmpl.URITemplate.Raw()) {
				out[t.tmpl.URITemplate.Raw()] = true
			}
		}
	}
	return out
}
