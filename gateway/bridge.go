package gateway

import (
	"context"
	"errors"
	"fmt"
	"github.com/sandgate/sandgate/audit"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// errNoSession is returned to an upstream that asks something of a client (sampling,
// elicitation, roots) outside any call Sandgate can attribute to a sandbox session.
var errNoSession = errors.New("no sandbox session is attached to this request")

// inflight tracks the calls forwarded to each upstream so that what the upstream sends back
// about a call (progress, log messages) reaches the sandbox session that made it.
//
// Progress tokens are rewritten: the upstream sees a token Sandgate made ("sg-N"), unique
// across sandboxes sharing the upstream session, and the sandbox sees its own token again.
type inflight struct {
	next  atomic.Uint64
	mu    sync.Mutex
	calls map[*upstream]map[string]*inflightCall
}

type inflightCall struct {
	ctx   context.Context
	token mcp.ProgressToken // the sandbox's own token, nil if it asked for no progress
}

func newInflight() *inflight { return &inflight{calls: map[*upstream]map[string]*inflightCall{}} }

// begin registers a call and returns the _meta to send upstream.
func (f *inflight) begin(ctx context.Context, u *upstream, meta *mcp.Meta) *mcp.Meta {
	key := "sg-" + strconv.FormatUint(f.next.Add(1), 10)
	c := &inflightCall{ctx: ctx}
	out := &mcp.Meta{ProgressToken: key}
	if meta != nil {
		c.token = meta.ProgressToken
		out.AdditionalFields = upstreamMeta(meta.AdditionalFields)
	}
	f.mu.Lock()
	if f.calls[u] == nil {
		f.calls[u] = map[string]*inflightCall{}
	}
	f.calls[u][key] = c
	f.mu.Unlock()
	return out
}

// upstreamMeta is the sandbox's _meta as forwarded upstream: without the protocol's own
// "io.modelcontextprotocol/" keys (protocol version, client info and capabilities, log level),
// which describe the sandbox's hop to Sandgate; the upstream hop has its own, negotiated by
// Sandgate. Forwarding a sandbox's 2026-07-28 protocol version to an upstream session on an
// older revision makes the upstream refuse the call (header mismatch).
func upstreamMeta(fields map[string]any) map[string]any {
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		if !strings.HasPrefix(k, protocolMetaPrefix) {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

const protocolMetaPrefix = "io.modelcontextprotocol/"

func (f *inflight) end(u *upstream, meta *mcp.Meta) {
	key, _ := meta.ProgressToken.(string)
	f.mu.Lock()
	delete(f.calls[u], key)
	f.mu.Unlock()
}

func (f *inflight) byToken(u *upstream, token any) (*inflightCall, bool) {
	key, ok := token.(string)
	if !ok {
		return nil, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.calls[u][key]
	return c, ok
}

// only returns the call in flight on u when there is exactly one: a notification that names
// no request (a log message) can then be attributed without guessing.
func (f *inflight) only(u *upstream) (*inflightCall, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls[u]) != 1 {
		return nil, false
	}
	for _, c := range f.calls[u] {
		return c, true
	}
	return nil, false
}

// onUpstreamNotification routes one notification from an upstream:
//   - list_changed (tools, resources, prompts): the catalog is listed again, and the sandboxes'
//     sessions are told when the aggregated lists change;
//   - progress: to the call that asked for it, with the sandbox's own token;
//   - log messages: to the call in flight when there is exactly one, else dropped (logged);
//   - resources/updated: to the sessions that subscribed to that URI;
//   - anything else is dropped.
func (g *Gateway) onUpstreamNotification(u *upstream, n mcp.JSONRPCNotification) {
	params := n.Params.AdditionalFields
	switch n.Method {
	case mcp.MethodNotificationToolsListChanged, mcp.MethodNotificationResourcesListChanged, mcp.MethodNotificationPromptsListChanged:
		u.requestRefresh()
	case string(mcp.MethodNotificationProgress):
		c, ok := g.inflight.byToken(u, params["progressToken"])
		if !ok || c.token == nil {
			return
		}
		out := maps.Clone(params)
		out["progressToken"] = c.token
		if err := g.mcp.SendNotificationToClient(c.ctx, n.Method, out); err != nil {
			g.log.Debug("progress notification not delivered", "upstream", u.cfg.Name, "err", err)
		}
	case string(mcp.MethodNotificationMessage):
		c, ok := g.inflight.only(u)
		if !ok {
			g.log.Debug("upstream log message outside a single call dropped", "upstream", u.cfg.Name)
			return
		}
		if s, ok := server.ClientSessionFromContext(c.ctx).(server.SessionWithLogging); ok {
			level, _ := params["level"].(string)
			if min := s.GetLogLevel(); min != "" && !mcp.LoggingLevel(level).ShouldSendTo(min) {
				return
			}
		}
		if err := g.mcp.SendNotificationToClient(c.ctx, n.Method, params); err != nil {
			g.log.Debug("log notification not delivered", "upstream", u.cfg.Name, "err", err)
		}
	case mcp.MethodNotificationResourceUpdated:
		uri, _ := params["uri"].(string)
		for _, sid := range g.subs.sessions(u, uri) {
			_ = g.mcp.SendNotificationToSpecificClient(sid, n.Method, params)
		}
	}
}

// sessionContext is the context of the sandbox session an upstream request belongs to.
//
// Over Streamable HTTP the upstream's request arrives on the stream of the call Sandgate
// forwarded, whose context carries the sandbox's session. Over stdio it arrives on the process's
// one pipe with no such context: it is attributed to the call in flight on that upstream when
// there is exactly one, and refused when there are several, so it never reaches a sandbox that
// did not make the call.
func (g *Gateway) sessionContext(ctx context.Context, u *upstream) (context.Context, error) {
	if s := server.ClientSessionFromContext(ctx); s != nil {
		return ctx, nil
	}
	if c, ok := g.inflight.only(u); ok && server.ClientSessionFromContext(c.ctx) != nil {
		return c.ctx, nil
	}
	return nil, errNoSession
}

// bridgeSampling forwards sampling/createMessage to the sandbox whose call the upstream is
// serving.
type bridgeSampling struct {
	g *Gateway
	u *upstream
}

func (b bridgeSampling) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	ctx, err := b.g.sessionContext(ctx, b.u)
	if err != nil {
		return nil, fmt.Errorf("sampling: %w", err)
	}
	// Asked of the sandbox's session itself: mcp-go's MCPServer.RequestSampling is deprecated
	// with the Sampling feature, which the sandbox's revision may still have.
	s, ok := server.ClientSessionFromContext(ctx).(server.SessionWithSampling)
	if !ok || modernSession(s) {
		return nil, errors.New("sampling: the sandbox's session cannot be asked for sampling")
	}
	return s.RequestSampling(ctx, req)
}

// modernSession reports a sandbox session on 2026-07-28 or later, which takes no
// server-initiated requests.
func modernSession(s server.ClientSession) bool {
	v, ok := s.(interface{ ProtocolVersion() string })
	return ok && mcp.IsModernProtocol(v.ProtocolVersion())
}

// bridgeElicitation forwards elicitation/create the same way.
type bridgeElicitation struct {
	g *Gateway
	u *upstream
}

func (b bridgeElicitation) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	ctx, err := b.g.sessionContext(ctx, b.u)
	if err != nil {
		return nil, fmt.Errorf("elicitation: %w", err)
	}
	return b.g.mcp.RequestElicitation(ctx, req)
}

// bridgeRoots forwards roots/list the same way.
type bridgeRoots struct {
	g *Gateway
	u *upstream
}

func (b bridgeRoots) ListRoots(ctx context.Context, req mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	ctx, err := b.g.sessionContext(ctx, b.u)
	if err != nil {
		return nil, fmt.Errorf("roots: %w", err)
	}
	return b.g.mcp.RequestRoots(ctx, req)
}

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

func (s *subscriptions) drop(sid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byURI := range s.subs {
		for _, m := range byURI {
			delete(m, sid)
		}
	}
}

// afterSubscribe forwards resources/subscribe for a readable resource to its upstream (once per
// URI, however many sandboxes subscribe).
func (g *Gateway) afterSubscribe(ctx context.Context, _ any, req *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
	s := server.ClientSessionFromContext(ctx)
	u, ok := g.resourceUpstream(req.Params.URI)
	if s == nil || !ok || !g.visible(ctx, audit.KindResourcesRead, u.cfg.Name, req.Params.URI) {
		return
	}
	if g.subs.add(u, req.Params.URI, s.SessionID()) {
		g.forwardSubscription(ctx, u, mcp.MethodResourcesSubscribe, req.Params.URI)
	}
}

func (g *Gateway) afterUnsubscribe(ctx context.Context, _ any, req *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
	s := server.ClientSessionFromContext(ctx)
	u, ok := g.resourceUpstream(req.Params.URI)
	if s == nil || !ok {
		return
	}
	if g.subs.remove(u, req.Params.URI, s.SessionID()) {
		g.forwardSubscription(ctx, u, mcp.MethodResourcesUnsubscribe, req.Params.URI)
	}
}

// forwardSubscription sends resources/subscribe or resources/unsubscribe to an upstream on the
// legacy protocol. 2026-07-28 replaced them with a subscriptions/listen stream, which Sandgate
// does not open yet: a modern upstream's resource updates do not reach sandboxes.
func (g *Gateway) forwardSubscription(ctx context.Context, u *upstream, method mcp.MCPMethod, uri string) {
	cli, _, err := u.client()
	if err != nil {
		return
	}
	if mcp.IsModernProtocol(cli.ProtocolVersion()) {
		g.log.Debug("resource subscriptions are not forwarded to 2026-07-28 upstreams", "upstream", u.cfg.Name, "uri", uri)
		return
	}
	if _, err := rpc(context.WithoutCancel(ctx), cli, string(method), map[string]any{"uri": uri}); err != nil {
		g.log.Warn("forward "+string(method)+" failed", "upstream", u.cfg.Name, "err", err)
	}
}
