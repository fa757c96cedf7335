package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// What the gateway answers itself: the handshake of each revision, ping, the log level, a
// sandbox's notifications and its answers to the gateway's requests, and the end of a session.
// Server info and capabilities are Sandgate's own: it serves several upstreams at once.

// serverInfo is how Sandgate introduces itself to sandboxes.
var serverInfo = mcp.Implementation{Name: "sandgate", Version: "1"}

// capabilities are what Sandgate offers a sandbox: every feature it relays, and tasks when an
// upstream of the sandbox's revision offers them (tasks.go).
func (g *Gateway) capabilities(modern bool) mcp.ServerCapabilities {
	c := mcp.ServerCapabilities{Logging: &struct{}{}, Completions: &struct{}{}}
	c.Tools = &struct {
		ListChanged bool `json:"listChanged,omitempty"`
	}{ListChanged: true}
	c.Prompts = &struct {
		ListChanged bool `json:"listChanged,omitempty"`
	}{ListChanged: true}
	c.Resources = &struct {
		Subscribe   bool `json:"subscribe,omitempty"`
		ListChanged bool `json:"listChanged,omitempty"`
	}{Subscribe: true, ListChanged: true}
	if modern {
		if g.anyUpstreamTasks(true) {
			c.Extensions = map[string]any{tasksExtension: map[string]any{}}
		}
	} else if g.anyUpstreamTasks(false) {
		c.Tasks = legacyTasksCapability()
	}
	return c
}

// initialize opens a session (revisions before 2026-07-28): the newest revision both speak, the
// session's ID in Mcp-Session-Id, Sandgate's server info and capabilities.
func (x *exchange) initialize(context.Context, call.Grant) (response, call.End) {
	var p struct {
		ProtocolVersion string                 `json:"protocolVersion"`
		Capabilities    mcp.ClientCapabilities `json:"capabilities"`
		ClientInfo      mcp.Implementation     `json:"clientInfo"`
	}
	if err := json.Unmarshal(orNull(x.msg.Params), &p); err != nil {
		return x.respond(x.rpcError(codeInvalidParams, "initialize: params are not InitializeParams", nil)), call.Answered(http.StatusOK)
	}
	version := mcp.LATEST_LEGACY_PROTOCOL_VERSION
	if slices.Contains(mcp.ValidProtocolVersions, p.ProtocolVersion) && !mcp.IsModernProtocol(p.ProtocolVersion) {
		version = p.ProtocolVersion
	}
	peer, _ := identity.ParsePeer(x.r.RemoteAddr)
	sid := x.g.sessions.Create(peer)
	s := x.g.sandboxes.open(sid)
	s.initialized(p.ClientInfo, p.Capabilities, version)
	s.seen(x.id)
	x.g.sessions.Initialized(x.r.Context(), sid, p.ClientInfo, p.Capabilities, version)
	res, _ := json.Marshal(mcp.InitializeResult{ProtocolVersion: version, Capabilities: x.g.capabilities(false), ServerInfo: serverInfo})
	x.w.Header().Set(mcp.HeaderSessionID, sid)
	return x.respond(x.result(res)), call.Answered(http.StatusOK)
}

// discover answers server/discover (2026-07-28): the revisions Sandgate serves that way, its
// capabilities and its server info, never cached across callers (what each sees is its own).
func (x *exchange) discover(context.Context, call.Grant) (response, call.End) {
	res := mcp.DiscoverResult{SupportedVersions: []string{mcp.ProtocolVersion20260728}, Capabilities: x.g.capabilities(true)}
	res.ResultType = mcp.ResultTypeComplete
	res.SetCacheHints(0, mcp.CacheScopePrivate)
	res.Meta = &mcp.Meta{AdditionalFields: map[string]any{mcp.MetaKeyServerInfo: serverInfo}}
	b, _ := json.Marshal(res)
	return x.respond(x.result(b)), call.Answered(http.StatusOK)
}

// ping answers ping (revisions before 2026-07-28).
func (x *exchange) ping(context.Context, call.Grant) (response, call.End) {
	return x.respond(x.result([]byte(`{}`))), call.Answered(http.StatusOK)
}

// setLevel sets the session's log level (revisions before 2026-07-28): the upstreams send every
// sandboxMessage, and each session's level filters them.
func (x *exchange) setLevel(context.Context, call.Grant) (response, call.End) {
	x.session.setLevel(mcp.LoggingLevel(jsonscan.String(x.msg.p.level)))
	return x.respond(x.result([]byte(`{}`))), call.Answered(http.StatusOK)
}

// askSetLevel refuses a level the protocol does not have (invalid params, the level in the
// event's reason: a sandbox's text is no metric label).
func askSetLevel(_ context.Context, x *exchange) (call.Question, *call.Refusal) {
	if level := mcp.LoggingLevel(jsonscan.String(x.msg.p.level)); !slices.Contains(logLevels, level) {
		return call.Question{}, call.Refuse(call.CodeBadParams, "logging/setLevel: invalid logging level '%s'", truncate(string(level), 64))
	}
	return call.Question{}, nil
}

var logLevels = []mcp.LoggingLevel{mcp.LoggingLevelDebug, mcp.LoggingLevelInfo, mcp.LoggingLevelNotice, mcp.LoggingLevelWarning,
	mcp.LoggingLevelError, mcp.LoggingLevelCritical, mcp.LoggingLevelAlert, mcp.LoggingLevelEmergency}

// notification takes a sandbox's notification (202): a cancellation cancels the call it names,
// the others concern Sandgate's hop only and end here; a roots list change goes on to the
// sandbox's own upstream sessions, which asked for its roots.
func (x *exchange) notification(context.Context, call.Grant) (response, call.End) {
	switch x.msg.Method {
	case string(mcp.MethodNotificationCancelled):
		var p struct {
			RequestID json.RawMessage `json:"requestId"`
		}
		if json.Unmarshal(orNull(x.msg.Params), &p) == nil && p.RequestID != nil && x.session != nil {
			x.session.cancelRequest(p.RequestID)
		}
	case mcp.MethodNotificationRootsListChanged:
		if x.sid != "" {
			x.g.rootsChanged(x.sid, x.body)
		}
	}
	return response{status: http.StatusAccepted}, call.Answered(http.StatusAccepted)
}

// answered takes a sandbox's answer to a request the gateway asked of it (outbound.go).
func (x *exchange) answered(context.Context, call.Grant) (response, call.End) {
	if !x.g.sandboxAnswered(x.sid, x.msg) {
		x.cl.Note("unexpected_response")
	}
	return response{status: http.StatusAccepted}, call.Answered(http.StatusAccepted)
}

// endSession ends the caller's session (DELETE).
func (x *exchange) endSession() (response, call.End) {
	peer, _ := identity.ParsePeer(x.r.RemoteAddr)
	x.g.sessions.Terminate(x.r.Header.Get(mcp.HeaderSessionID), peer)
	return response{status: http.StatusOK}, call.Answered(http.StatusOK)
}

// rootsChanged tells the upstream sessions of sandbox session sid that its roots changed.
func (g *Gateway) rootsChanged(sid string, msg []byte) {
	for _, u := range g.upstreams {
		if c := u.sessionConn(sid); c != nil {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
				defer cancel()
				_ = c.GetTransport().SendNotification(ctx, mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION,
					Notification: mcp.Notification{Method: mcp.MethodNotificationRootsListChanged}})
			}()
		}
	}
}
