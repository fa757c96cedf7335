package gateway

import (
	"context"
	"encoding/json"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// What an upstream connection sends that is not a response (a notification, or a request to
// its client) is routed to the stream a sandbox would have received it on had it been the
// upstream's client itself:
//
//   - sent on a call's response stream (or, over stdio, attributable to one call): that call's
//     stream, in the order the upstream sent it, before the call's result;
//   - sent on the upstream session's listening stream (the GET of 2025-11-25, the
//     subscriptions/listen stream of 2026-07-28; over stdio, outside any call): the GET stream
//     of the sandbox session whose upstream session it is.
//
// On the shared upstream session there is no such sandbox. There progress goes to the call
// that asked for it (by token, on any stream), list changes refresh the catalog and each
// sandbox whose visible lists changed is told (listchanged.go), resource updates go to the
// sandboxes subscribed to that URI, ping is answered by Sandgate, and anything else that
// cannot be attributed (a log message, a roots/list, sampling or elicitation request outside
// a call) is dropped (requests: refused with an error), so that it never reaches a sandbox it
// does not concern. docs/mcp-gateway.md has the table.

// inbound is one message an upstream sent that is not a response.
type inbound struct {
	raw    []byte // as the upstream wrote it
	method string
	id     json.RawMessage // a request's ID; nil for a notification
	params json.RawMessage
	// call is the call whose response stream carried it; nil for the listening stream (or a
	// stdio message no call can be told by).
	call *inflightCall
}

// parseInbound reads raw, a message with a method, as an inbound message.
func parseInbound(raw []byte) (inbound, bool) {
	in := inbound{raw: raw}
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, err := jsonscan.KeyName(key, escaped)
		if err != nil {
			return err
		}
		switch name {
		case "method":
			return json.Unmarshal(val, &in.method)
		case "id":
			if string(val) != "null" {
				in.id = val
			}
		case "params":
			in.params = val
		}
		return nil
	})
	return in, err == nil && in.method != ""
}

// reply is a sandbox's (or Sandgate's) answer to an upstream's request: a result, or a JSON-RPC
// error object, each as written.
type clientReply struct {
	result json.RawMessage
	err    json.RawMessage
}

func errorReply(code int, msg string) clientReply {
	b, _ := json.Marshal(rpcError{Code: code, Message: msg})
	return clientReply{err: b}
}

// upstreamMessage routes one notification of upstream connection sid ("" for the shared one).
func (g *Gateway) upstreamMessage(u *upstream, sid string, in inbound) {
	switch in.method {
	case mcp.MethodNotificationToolsListChanged, mcp.MethodNotificationResourcesListChanged, mcp.MethodNotificationPromptsListChanged:
		// The catalog is the shared connection's: its list changes refresh it. A sandbox's own
		// upstream session says what it lists to that sandbox (capabilities.go).
		if sid == "" {
			u.requestRefresh()
			return
		}
		u.sessionListChanged(sid)
		if s := g.sandboxes.get(sid); s != nil {
			go g.tellListChangesTo(s)
		}
	case mcp.MethodNotificationSubscriptionsAcknowledged:
		// The shared connection's subscriptions/listen stream is open (upstream.subscribe): list
		// changes are told from now on, but one made since the catalog was listed, before the
		// stream opened, was told to no one. The catalog is listed again. Any other
		// acknowledgement goes where it did before.
		if sid == "" && in.call == nil {
			u.requestRefresh()
			return
		}
		g.relayOther(u, sid, in)
	case string(mcp.MethodNotificationProgress):
		g.relayProgress(u, sid, in)
	case string(mcp.MethodNotificationMessage):
		g.relayLog(u, sid, in)
	case mcp.MethodNotificationResourceUpdated:
		g.relayResourceUpdate(u, sid, in)
	default:
		g.relayOther(u, sid, in)
	}
}

// relayProgress sends progress to the call that asked for it, under the sandbox's own token.
func (g *Gateway) relayProgress(u *upstream, sid string, in inbound) {
	var token json.RawMessage
	_ = jsonscan.Named(in.params, []string{"progressToken"}, func(_ int, v []byte) error {
		token = v
		return nil
	})
	if token == nil {
		return
	}
	c, ok := g.inflight.byToken(u, sid, token)
	if !ok || c.progressToken() == nil {
		return
	}
	params, err := jsonenc.WithMember(in.params, "progressToken", c.progressToken())
	if err != nil {
		return
	}
	g.relayToCall(c, notificationBytes(in.method, params))
}

// relayLog sends a log message to the call it came with, or to the GET stream of the sandbox
// whose upstream session sent it, if that sandbox's level lets it through.
func (g *Gateway) relayLog(u *upstream, sid string, in inbound) {
	var p struct {
		Level mcp.LoggingLevel `json:"level"`
	}
	_ = json.Unmarshal(in.params, &p)
	if in.call != nil {
		if g.callWantsLog(in.call, p.Level) {
			g.relayToCall(in.call, in.raw)
		}
		return
	}
	if s := g.sandboxes.get(sid); s != nil && sid != "" {
		if s.wantsLog(p.Level) {
			s.stream.deliver(in.raw)
		}
		return
	}
	g.log.Debug("upstream log message outside a call on a shared session dropped: no sandbox to attribute it to", "upstream", u.cfg.Name)
}

// relayResourceUpdate sends a resource update of upstream session sid ("" the shared one) to
// that session's subscribers of the URI: sandbox sessions' GET streams, listen streams.
func (g *Gateway) relayResourceUpdate(u *upstream, sid string, in inbound) {
	var p struct {
		URI string `json:"uri"`
	}
	_ = json.Unmarshal(in.params, &p)
	for _, key := range g.subs.subscribers(u, sid, p.URI) {
		if l := g.listens.get(key); l != nil {
			l.deliver(in.method, in.params)
		} else if s := g.sandboxes.get(key); s != nil {
			s.stream.deliver(in.raw)
		}
	}
}

// relayOther sends a notification to the call it came with, or to the GET stream of the
// sandbox whose upstream session sent it; on the shared session, outside a call, it concerns
// no sandbox in particular and is dropped.
func (g *Gateway) relayOther(u *upstream, sid string, in inbound) {
	switch {
	case in.call != nil:
		g.relayToCall(in.call, in.raw)
	case sid != "":
		if s := g.sandboxes.get(sid); s != nil {
			s.stream.deliver(in.raw)
		}
	default:
		g.log.Debug("upstream notification outside a call on a shared session dropped", "upstream", u.cfg.Name, "method", in.method)
	}
}

// callWantsLog reports whether the sandbox of call c asked for log messages of level: on
// 2026-07-28 the level its request carried (none: no log message), before that its session's.
func (g *Gateway) callWantsLog(c *inflightCall, level mcp.LoggingLevel) bool {
	if s := g.sandboxes.get(c.sid); s != nil && c.sid != "" {
		return s.wantsLog(level)
	}
	if x := c.exchange(); x != nil && x.meta.level != "" {
		return level.ShouldSendTo(x.meta.level)
	}
	return false
}

// relayToCall sends msg, one JSON-RPC message, on call c's stream, in the order it came.
func (g *Gateway) relayToCall(c *inflightCall, msg []byte) {
	if x := c.exchange(); x != nil {
		x.out.event(msg)
	}
}

// upstreamRequest answers one request upstream connection sid made of its client: the sandbox
// it concerns is asked (ask), or Sandgate answers a ping itself where it concerns none.
func (g *Gateway) upstreamRequest(ctx context.Context, u *upstream, sid string, in inbound) clientReply {
	var to askTarget
	switch {
	case in.call != nil:
		to = askTarget{call: in.call, session: g.sandboxes.get(in.call.sid)}
	case sid != "":
		to = askTarget{session: g.sandboxes.get(sid)}
	}
	if to.call == nil && to.session == nil {
		if in.method == string(mcp.MethodPing) {
			return clientReply{result: json.RawMessage(`{}`)}
		}
		g.log.Info("upstream request outside a call on a shared session refused: no sandbox to ask", "upstream", u.cfg.Name, "method", in.method)
		return errorReply(codeInternalError, in.method+": no sandbox session is attached to this request")
	}
	return g.ask(ctx, to, u, in)
}

// notificationBytes is a notification of method with params.
func notificationBytes(method string, params json.RawMessage) []byte {
	b := append([]byte(`{"jsonrpc":"2.0","method":`), jsonenc.AppendString(nil, method)...)
	if len(params) > 0 {
		b = append(append(b, `,"params":`...), params...)
	}
	return append(b, '}')
}
