package gateway

import (
	"context"
	"net/http"
	"slices"
	"sync"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
)

// subscriptions remembers which subscribers (sandbox sessions, and the listen streams of
// 2026-07-28 sandboxes) subscribed to which upstream resource on the shared connection.
type subscriptions struct {
	mu   sync.Mutex
	subs map[*upstream]map[string]map[string]bool // upstream → uri → subscriber keys
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

// subscribe takes resources/subscribe (revisions before 2026-07-28) for a resource the caller
// may read, and forwards it to its upstream: on the sandbox's own upstream session where it has
// one; on the shared session once per URI, however many sandboxes subscribe. A 2026-07-28
// upstream has no resources/subscribe: the URIs subscribed to are the filter of its
// subscriptions/listen stream, opened again when they change (upstream.subscribe). A resource
// the caller may not read is subscribed to nothing, and answered alike.
func (x *exchange) subscribe(ctx context.Context, _ call.Grant) (response, call.End) {
	uri := stringOf(x.msg.p.uri)
	x.cl.Describe(audit.Target{Tool: uri})
	if u, ok := x.g.resourceUpstream(uri); ok && x.g.visible(ctx, x.caller(), audit.KindResourcesRead, u.cfg.Name, uri) {
		x.cl.Describe(audit.Target{Upstream: u.cfg.Name})
		x.g.subscribeUpstream(ctx, u, uri, x.sid, true)
	}
	return x.respond(x.result([]byte(`{}`))), call.Answered(http.StatusOK)
}

// unsubscribe takes resources/unsubscribe (revisions before 2026-07-28).
func (x *exchange) unsubscribe(ctx context.Context, _ call.Grant) (response, call.End) {
	uri := stringOf(x.msg.p.uri)
	x.cl.Describe(audit.Target{Tool: uri})
	if u, ok := x.g.resourceUpstream(uri); ok {
		x.cl.Describe(audit.Target{Upstream: u.cfg.Name})
		x.g.subscribeUpstream(ctx, u, uri, x.sid, false)
	}
	return x.respond(x.result([]byte(`{}`))), call.Answered(http.StatusOK)
}

// subscribeUpstream subscribes subscriber (a sandbox session, or a listen stream's key) to uri
// of u (or unsubscribes it, on: false).
func (g *Gateway) subscribeUpstream(ctx context.Context, u *upstream, uri, subscriber string, on bool) {
	method, delta := mcp.MethodResourcesSubscribe, 1
	if !on {
		method, delta = mcp.MethodResourcesUnsubscribe, -1
	}
	l, err := u.lease(ctx, ownSessionKey(subscriber))
	if err != nil {
		return
	}
	defer l.end(outcomeOK, nil)
	if l.conn != nil {
		if g.forwardSubscription(ctx, u, l.cli, method, uri) {
			l.subscribed(delta)
		}
		return
	}
	changed := g.subs.remove(u, uri, subscriber)
	if on {
		changed = g.subs.add(u, uri, subscriber)
	}
	if !changed {
		return
	}
	if mcp.IsModernProtocol(l.cli.ProtocolVersion()) {
		u.resubscribe()
		return
	}
	g.forwardSubscription(ctx, u, l.cli, method, uri)
}

// ownSessionKey is the key of subscriber's own upstream sessions: a legacy sandbox session's;
// a listen stream subscribes on the shared session ("").
func ownSessionKey(subscriber string) string {
	if isListener(subscriber) {
		return ""
	}
	return subscriber
}

// subscribedURIs are the URIs of u some sandbox subscribed to on the shared connection.
func (g *Gateway) subscribedURIs(u *upstream) []string { return g.subs.uris(u) }

// forwardSubscription sends resources/subscribe or resources/unsubscribe (legacy revisions).
func (g *Gateway) forwardSubscription(ctx context.Context, u *upstream, cli *client.Client, method mcp.MCPMethod, uri string) bool {
	if _, err := rpc(context.WithoutCancel(ctx), cli, string(method), map[string]any{"uri": uri}); err != nil {
		g.log.Warn("forward "+string(method)+" failed", "upstream", u.cfg.Name, "err", err)
		return false
	}
	return true
}
