package gateway

import (
	"context"
	"maps"

	"github.com/mark3labs/mcp-go/mcp"
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

// listed records what a sandbox session (nil: none) was shown of a list.
func (g *Gateway) listed(s *sandboxSession, method mcp.MCPMethod, names []string) {
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

// tellListChanges tells each sandbox session, and each listen stream, whose visible lists
// changed since it listed them. The catalog's rebuild runs it, before the rebuild is over.
func (g *Gateway) tellListChanges() {
	for _, s := range g.sandboxes.all() {
		g.tellListChangesTo(s)
	}
	for _, l := range g.listens.all() {
		g.tellListener(l)
	}
}

// tellListChangesTo tells sandbox session s which of its visible lists changed since it listed
// them.
func (g *Gateway) tellListChangesTo(s *sandboxSession) {
	s.mu.Lock()
	shown := maps.Clone(s.shown)
	s.mu.Unlock()
	who := caller{id: s.identity(), sid: s.id}
	told := map[string]bool{}
	for _, lc := range listChanges {
		before, ok := shown[lc.method]
		if !ok {
			continue
		}
		now := g.visibleNames(s.ctx, who, lc.method)
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

// visibleNames is what who would be shown of a list now.
func (g *Gateway) visibleNames(ctx context.Context, who caller, method mcp.MCPMethod) map[string]bool {
	out := map[string]bool{}
	var k listKind
	for _, lk := range listKinds {
		if lk.method == method {
			k = lk
		}
	}
	capable := g.capabilityOf(ctx, who)
	kind := listKindOf[method]
	for _, e := range g.view.Load().list(k).entries {
		if g.visible(ctx, who, kind, e.up.cfg.Name, e.name) && (k != listTools || capable.allows(e.up, e.name)) {
			out[e.id] = true
		}
	}
	return out
}
