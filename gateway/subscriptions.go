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
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// A sandbox subscribes to a resource with resources/subscribe (revisions before 2026-07-28) or
// a subscriptions/listen stream (2026-07-28, listen.go): either way the subscription is the
// upstream's, on the upstream session the sandbox's requests use — its own where the upstream
// has them (per-sandbox), else the shared one — sent once per URI and session however many
// subscribers it has there, and ended with the last. A 2026-07-28 upstream has no
// resources/subscribe: the URIs subscribed to on the shared connection are the filter of its
// subscriptions/listen stream, opened again when they change (upstream.subscribe). An update the
// upstream sends on a session goes to that session's subscribers of the URI.

// subscriptions remembers who subscribed to which resource of which upstream session.
type subscriptions struct {
	mu sync.Mutex
	// subs: upstream → session key ("" the shared one) → URI → subscriber keys (a sandbox
	// session's ID, or a listen stream's key).
	subs map[*upstream]map[string]map[string]map[string]bool
}

func newSubscriptions() *subscriptions {
	return &subscriptions{subs: map[*upstream]map[string]map[string]map[string]bool{}}
}

// change adds (on) or removes a subscriber of uri on session key of u, and reports whether it
// was the first, or the last, one there.
func (s *subscriptions) change(u *upstream, key, uri, subscriber string, on bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[u] == nil {
		s.subs[u] = map[string]map[string]map[string]bool{}
	}
	byURI := s.subs[u][key]
	if byURI == nil {
		byURI = map[string]map[string]bool{}
		s.subs[u][key] = byURI
	}
	set := byURI[uri]
	if on {
		if set == nil {
			set = map[string]bool{}
			byURI[uri] = set
		}
		first := len(set) == 0
		set[subscriber] = true
		return first
	}
	if !set[subscriber] {
		return false
	}
	delete(set, subscriber)
	return len(set) == 0
}

// subscribers are the subscribers of uri on session key of u.
func (s *subscriptions) subscribers(u *upstream, key, uri string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for sub := range s.subs[u][key][uri] {
		out = append(out, sub)
	}
	return out
}

// uris are the URIs of u some sandbox subscribed to on the shared connection.
func (s *subscriptions) uris(u *upstream) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for uri, subs := range s.subs[u][""] {
		if len(subs) > 0 {
			out = append(out, uri)
		}
	}
	slices.Sort(out)
	return out
}

// drop forgets every subscription of subscriber (its session or stream ended).
func (s *subscriptions) drop(subscriber string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byKey := range s.subs {
		for _, byURI := range byKey {
			for _, m := range byURI {
				delete(m, subscriber)
			}
		}
	}
}

// subscribe takes resources/subscribe (revisions before 2026-07-28) for a resource the caller
// may read. A resource the caller may not read is subscribed to nothing, and answered alike.
func (x *exchange) subscribe(ctx context.Context, _ call.Grant) (response, call.End) {
	uri := jsonscan.String(x.msg.p.uri)
	x.cl.Describe(audit.Target{Tool: uri})
	if u, ok := x.g.resourceUpstream(uri); ok && x.g.visible(ctx, x.caller(), audit.KindResourcesRead, u.cfg.Name, uri) {
		x.cl.Describe(audit.Target{Upstream: u.cfg.Name})
		x.g.subscribeUpstream(ctx, u, uri, x.sid, x.sid, true)
	}
	return x.respond(x.result([]byte(`{}`))), call.Answered(http.StatusOK)
}

// unsubscribe takes resources/unsubscribe (revisions before 2026-07-28).
func (x *exchange) unsubscribe(ctx context.Context, _ call.Grant) (response, call.End) {
	uri := jsonscan.String(x.msg.p.uri)
	x.cl.Describe(audit.Target{Tool: uri})
	if u, ok := x.g.resourceUpstream(uri); ok {
		x.cl.Describe(audit.Target{Upstream: u.cfg.Name})
		x.g.subscribeUpstream(ctx, u, uri, x.sid, x.sid, false)
	}
	return x.respond(x.result([]byte(`{}`))), call.Answered(http.StatusOK)
}

// subscribeUpstream subscribes subscriber to uri of u (or unsubscribes it, on: false), on the
// upstream session of the caller whose session key is key.
func (g *Gateway) subscribeUpstream(ctx context.Context, u *upstream, uri, subscriber, key string, on bool) {
	method, delta := mcp.MethodResourcesSubscribe, 1
	if !on {
		method, delta = mcp.MethodResourcesUnsubscribe, -1
	}
	l, err := u.lease(ctx, key)
	if err != nil {
		return
	}
	defer l.end(outcomeOK, nil)
	if l.conn == nil {
		key = ""
	}
	if !g.subs.change(u, key, uri, subscriber, on) {
		return
	}
	if l.conn != nil {
		if g.forwardSubscription(ctx, u, l.cli, method, uri) {
			l.subscribed(delta)
		}
		return
	}
	if mcp.IsModernProtocol(l.cli.ProtocolVersion()) {
		u.resubscribe()
		return
	}
	g.forwardSubscription(ctx, u, l.cli, method, uri)
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
