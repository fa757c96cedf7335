package gateway

import (
	"context"
	"slices"
	"sync"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/audit"
)

// subscriptions remembers which sandbox sessions subscribed to which upstream resource.
type subscriptions struct {
	mu   sync.Mutex
	subs map[*upstream]map[string]map[string]bool // upstream → uri → session IDs
}

func newSubscriptions() *subscriptions {
	return &subscriptions{subs: map[*upstream]map[string]map[string]bool{}}
}

// add records the subscription and reports whether it is the first for (u, uri).
func (s *subscriptions) add(u *upstream, uri, sid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[u] == nil {
		s.subs[u] = map[string]map[string]bool{}
	}
	first := len(s.subs[u][uri]) == 0
	if s.subs[u][uri] == nil {
		s.subs[u][uri] = map[string]bool{}
	}
	s.subs[u][uri][sid] = true
	return first
}

// remove drops the subscription and reports whether it was the last for (u, uri).
func (s *subscriptions) remove(u *upstream, uri, sid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.subs[u][uri]
	if !m[sid] {
		return false
	}
	delete(m, sid)
	return len(m) == 0
}

func (s *subscriptions) sessions(u *upstream, uri string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for sid := range s.subs[u][uri] {
		out = append(out, sid)
	}
	return out
}

// uris are the URIs of u some sandbox subscribed to on the shared connection.
func (s *subscriptions) uris(u *upstream) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for uri, sids := range s.subs[u] {
		if len(sids) > 0 {
			out = append(out, uri)
		}
	}
	slices.Sort(out)
	return out
}

func (s *subscriptions) drop(sid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byURI := range s.subs {
		for _, m := range byURI {
			delete(m, sid)
		}
	}
}

// afterSubscribe forwards resources/subscribe for a readable resource to its upstream: on the
// sandbox's own upstream session where it has one; on the shared session once per URI, however
// many sandboxes subscribe. A 2026-07-28 upstream has no resources/subscribe: the URIs
// subscribed to are the filter of its subscriptions/listen stream, opened again when they
// change (upstream.subscribe).
func (g *Gateway) afterSubscribe(ctx context.Context, _ any, req *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
	s := server.ClientSessionFromContext(ctx)
	u, ok := g.resourceUpstream(req.Params.URI)
	if s == nil || s.SessionID() == "" || !ok || !g.visible(ctx, audit.KindResourcesRead, u.cfg.Name, req.Params.URI) {
		return
	}
	l, err := u.lease(ctx)
	if err != nil {
		return
	}
	defer l.done(nil, false)
	if l.conn != nil {
		if g.forwardSubscription(ctx, u, l.cli, mcp.MethodResourcesSubscribe, req.Params.URI) {
			l.subscribed(1)
		}
		return
	}
	if !g.subs.add(u, req.Params.URI, s.SessionID()) {
		return
	}
	if mcp.IsModernProtocol(l.cli.ProtocolVersion()) {
		u.resubscribe()
		return
	}
	g.forwardSubscription(ctx, u, l.cli, mcp.MethodResourcesSubscribe, req.Params.URI)
}

func (g *Gateway) afterUnsubscribe(ctx context.Context, _ any, req *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
	s := server.ClientSessionFromContext(ctx)
	u, ok := g.resourceUpstream(req.Params.URI)
	if s == nil || s.SessionID() == "" || !ok {
		return
	}
	l, err := u.lease(ctx)
	if err != nil {
		return
	}
	defer l.done(nil, false)
	if l.conn != nil {
		if g.forwardSubscription(ctx, u, l.cli, mcp.MethodResourcesUnsubscribe, req.Params.URI) {
			l.subscribed(-1)
		}
		return
	}
	if !g.subs.remove(u, req.Params.URI, s.SessionID()) {
		return
	}
	if mcp.IsModernProtocol(l.cli.ProtocolVersion()) {
		u.resubscribe()
		return
	}
	g.forwardSubscription(ctx, u, l.cli, mcp.MethodResourcesUnsubscribe, req.Params.URI)
}

// forwardSubscription sends resources/subscribe or resources/unsubscribe (legacy revisions).
func (g *Gateway) forwardSubscription(ctx context.Context, u *upstream, cli *client.Client, method mcp.MCPMethod, uri string) bool {
	if _, err := rpc(context.WithoutCancel(ctx), cli, string(method), map[string]any{"uri": uri}); err != nil {
		g.log.Warn("forward "+string(method)+" failed", "upstream", u.cfg.Name, "err", err)
		return false
	}
	return true
}
