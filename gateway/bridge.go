package gateway

import (
	"context"
	"errors"
	"fmt"
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
	sid   string            // the sandbox session
	token mcp.ProgressToken // the sandbox's own token, nil if it asked for no progress
}

func newInflight() *inflight { return &inflight{calls: map[*upstream]map[string]*inflightCall{}} }

// begin registers a call and returns the _meta to send upstream (nil when there is none: a
// progress token goes upstream only when the sandbox asked for progress) and the call's key
// for end.
func (f *inflight) begin(ctx context.Context, u *upstream, meta *mcp.Meta) (*mcp.Meta, string) {
	key := "sg-" + strconv.FormatUint(f.next.Add(1), 10)
	c := &inflightCall{ctx: ctx}
	if s := server.ClientSessionFromContext(ctx); s != nil {
		c.sid = s.SessionID()
	}
	var out *mcp.Meta
	if meta != nil {
		c.token = meta.ProgressToken
		out = &mcp.Meta{AdditionalFields: upstreamMeta(meta.AdditionalFields)}
		if c.token != nil {
			out.ProgressToken = key
		}
		if out.ProgressToken == nil && out.AdditionalFields == nil {
			out = nil
		}
	}
	f.mu.Lock()
	if f.calls[u] == nil {
		f.calls[u] = map[string]*inflightCall{}
	}
	f.calls[u][key] = c
	f.mu.Unlock()
	return out, key
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

func (f *inflight) end(u *upstream, key string) {
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

// bySession returns a call of sandbox session sid in flight on u.
func (f *inflight) bySession(u *upstream, sid string) (*inflightCall, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls[u] {
		if c.sid == sid {
			return c, true
		}
	}
	return nil, false
}

// onUpstreamNotification routes one notification from an upstream connection (sid is the
// sandbox session whose own upstream session it is, "" for the shared one):
//   - list_changed (tools, resources, prompts): the catalog is listed again, and the sandboxes'
//     sessions are told when the aggregated lists change;
//   - progress: to the call that asked for it, with the sandbox's own token;
//   - log messages: to sandbox session sid; on the shared session, to the call in flight when
//     there is exactly one, else dropped (logged);
//   - resources/updated: to sandbox session sid; on the shared session, to the sessions that
//     subscribed to that URI;
//   - anything else is dropped.
func (g *Gateway) onUpstreamNotification(u *upstream, sid string, n mcp.JSONRPCNotification) {
	params := n.Params.AdditionalFields
	if sid != "" && (n.Method == string(mcp.MethodNotificationMessage) || n.Method == mcp.MethodNotificationResourceUpdated) {
		g.toSession(u, sid, n)
		return
	}
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

// toSession delivers n to sandbox session sid: through a call of that session in flight on u
// when there is one, so that it precedes that call's result, else to the session's stream.
func (g *Gateway) toSession(u *upstream, sid string, n mcp.JSONRPCNotification) {
	params := n.Params.AdditionalFields
	c, inCall := g.inflight.bySession(u, sid)
	if n.Method == string(mcp.MethodNotificationMessage) && inCall {
		if s, ok := server.ClientSessionFromContext(c.ctx).(server.SessionWithLogging); ok {
			level, _ := params["level"].(string)
			if min := s.GetLogLevel(); min != "" && !mcp.LoggingLevel(level).ShouldSendTo(min) {
				return
			}
		}
	}
	var err error
	switch {
	case inCall:
		err = g.mcp.SendNotificationToClient(c.ctx, n.Method, params)
	case n.Method == string(mcp.MethodNotificationMessage):
		var lm mcp.LoggingMessageNotification
		lm.Params.Level = mcp.LoggingLevel(fmt.Sprint(params["level"]))
		lm.Params.Logger, _ = params["logger"].(string)
		lm.Params.Data = params["data"]
		err = g.mcp.SendLogMessageToSpecificClient(sid, lm)
	default:
		err = g.mcp.SendNotificationToSpecificClient(sid, n.Method, params)
	}
	if err != nil {
		g.log.Debug("notification not delivered", "upstream", u.cfg.Name, "method", n.Method, "err", err)
	}
}

// sessionContext is the context of the sandbox session an upstream request belongs to.
//
// Over Streamable HTTP the upstream's request arrives on the stream of the call Sandgate
// forwarded, whose context carries the sandbox's session. Over stdio it arrives on the process's
// one pipe with no such context: it is attributed to the call in flight on that upstream when
// there is exactly one, and refused when there are several, so it never reaches a sandbox that
// did not make the call.
//
// On a sandbox session's own upstream session (sid) it belongs to a call of that session.
func (g *Gateway) sessionContext(ctx context.Context, u *upstream, sid string) (context.Context, error) {
	if s := server.ClientSessionFromContext(ctx); s != nil {
		return ctx, nil
	}
	if sid != "" {
		if c, ok := g.inflight.bySession(u, sid); ok {
			return c.ctx, nil
		}
		return nil, errNoSession
	}
	if c, ok := g.inflight.only(u); ok && server.ClientSessionFromContext(c.ctx) != nil {
		return c.ctx, nil
	}
	return nil, errNoSession
}

// bridgeSampling forwards sampling/createMessage to the sandbox whose call the upstream is
// serving.
type bridgeSampling struct {
	g   *Gateway
	u   *upstream
	sid string
}

func (b bridgeSampling) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	ctx, err := b.g.sessionContext(ctx, b.u, b.sid)
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
	g   *Gateway
	u   *upstream
	sid string
}

func (b bridgeElicitation) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	ctx, err := b.g.sessionContext(ctx, b.u, b.sid)
	if err != nil {
		return nil, fmt.Errorf("elicitation: %w", err)
	}
	return b.g.mcp.RequestElicitation(ctx, req)
}

// bridgeRoots forwards roots/list the same way.
type bridgeRoots struct {
	g   *Gateway
	u   *upstream
	sid string
}

func (b bridgeRoots) ListRoots(ctx context.Context, req mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	ctx, err := b.g.sessionContext(ctx, b.u, b.sid)
	if err != nil {
		return nil, fmt.Errorf("roots: %w", err)
	}
	return b.g.mcp.RequestRoots(ctx, req)
}
