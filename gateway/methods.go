package gateway

import (
	"context"
	"net/http"
	"slices"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/jsonscan"
	"github.com/sandgate/sandgate/internal/mcpsessions"
)

// method is one entry of the table of what the gateway does with each message: which revisions
// have it, whether a legacy request needs a session, what it asks policy, what it does once
// allowed, and how a refusal of it is answered in the protocol.
type method struct {
	kind           audit.Kind
	legacy, modern bool // the revisions that have it (before 2026-07-28, and from it)
	session        sessionRule
	ask            func(ctx context.Context, x *exchange) (call.Question, *call.Refusal)
	act            func(x *exchange, ctx context.Context, g call.Grant) (response, call.End)
	// refused answers a refusal of a request read (nil: a JSON-RPC error).
	refused func(x *exchange, rf *call.Refusal) []byte
}

// sessionRule is what a legacy request says of its session.
type sessionRule uint8

const (
	sessionNeeded sessionRule = iota // Mcp-Session-Id of a live session of the caller's
	sessionNone                      // initialize: none (it makes one)
)

const methodTasksUpdate = "tasks/update" // the 2026-07-28 tasks extension's

func both(m method) *method   { m.legacy, m.modern = true, true; return &m }
func legacy(m method) *method { m.legacy = true; return &m }
func modern(m method) *method { m.modern = true; return &m }

// methods is the table. A method of neither revision answers method-not-found (otherMethod).
var methods = map[string]*method{
	string(mcp.MethodInitialize):             legacy(method{kind: audit.KindInitialize, session: sessionNone, act: (*exchange).initialize}),
	string(mcp.MethodServerDiscover):         modern(method{kind: audit.KindDiscover, act: (*exchange).discover}),
	string(mcp.MethodPing):                   legacy(method{kind: audit.KindPing, act: (*exchange).ping}),
	string(mcp.MethodSetLogLevel):            legacy(method{kind: audit.KindSetLevel, ask: askSetLevel, act: (*exchange).setLevel}),
	string(mcp.MethodToolsList):              both(method{kind: audit.KindToolsList, act: listActOf(listTools)}),
	string(mcp.MethodPromptsList):            both(method{kind: audit.KindPromptsList, act: listActOf(listPrompts)}),
	string(mcp.MethodResourcesList):          both(method{kind: audit.KindResourcesList, act: listActOf(listResources)}),
	string(mcp.MethodResourcesTemplatesList): both(method{kind: audit.KindTemplatesList, act: listActOf(listTemplates)}),
	string(mcp.MethodToolsCall):              both(method{kind: audit.KindToolsCall, ask: askToolCall, act: (*exchange).forward, refused: toolRefused}),
	string(mcp.MethodPromptsGet):             both(method{kind: audit.KindPromptsGet, ask: askPrompt, act: (*exchange).forward, refused: hiddenRefused}),
	string(mcp.MethodResourcesRead):          both(method{kind: audit.KindResourcesRead, ask: askRead, act: (*exchange).forward, refused: hiddenRefused}),
	string(mcp.MethodCompletionComplete):     both(method{kind: audit.KindComplete, ask: askComplete, act: (*exchange).forward, refused: hiddenRefused}),
	string(mcp.MethodResourcesSubscribe):     legacy(method{kind: audit.KindSubscribe, act: (*exchange).subscribe}),
	string(mcp.MethodResourcesUnsubscribe):   legacy(method{kind: audit.KindUnsubscribe, act: (*exchange).unsubscribe}),
	string(mcp.MethodSubscriptionsListen):    modern(method{kind: audit.KindListen, act: (*exchange).listen}),
	string(mcp.MethodTasksGet):               both(method{kind: audit.KindTasks, ask: askTask, act: (*exchange).task, refused: hiddenRefused}),
	string(mcp.MethodTasksResult):            legacy(method{kind: audit.KindTasks, ask: askTask, act: (*exchange).task, refused: hiddenRefused}),
	string(mcp.MethodTasksCancel):            both(method{kind: audit.KindTasks, ask: askTask, act: (*exchange).task, refused: hiddenRefused}),
	methodTasksUpdate:                        modern(method{kind: audit.KindTasks, ask: askTask, act: (*exchange).task, refused: hiddenRefused}),
	string(mcp.MethodTasksList):              legacy(method{kind: audit.KindTasks, act: (*exchange).listTasks}),
}

var (
	notificationMethod = &method{kind: audit.KindNotification, legacy: true, modern: true, act: (*exchange).notification}
	responseMethod     = &method{kind: audit.KindResponse, legacy: true, act: (*exchange).answered}
	otherMethod        = &method{kind: audit.KindOtherMethod, legacy: true, modern: true, act: (*exchange).notFound}
)

// methodOf is the table's entry for m.
func methodOf(m sandboxMessage) *method {
	switch {
	case m.isResponse():
		return responseMethod
	case m.ID == nil:
		return notificationMethod
	}
	if e, ok := methods[m.Method]; ok {
		return e
	}
	return otherMethod
}

// protocol checks the request against its revision: on 2026-07-28, its standard headers and
// that the method is of that revision; before it, its session.
func (x *exchange) protocol() *call.Refusal {
	x.meta = readMeta(x.msg.p.meta)
	x.modern = modernRequest(x.r) || mcp.IsModernProtocol(x.meta.version)
	if x.modern {
		if rf := x.checkHeaders(); rf != nil {
			return rf
		}
		if !x.m.modern && x.msg.isRequest() {
			x.m = otherMethod
		}
		return nil
	}
	if !x.m.legacy && x.msg.isRequest() {
		x.m = otherMethod
	}
	return x.session0(x.m.session == sessionNeeded)
}

// session0 checks the legacy request's Mcp-Session-Id (needed: a live session of the caller's),
// or the session caps of an initialize (none).
func (x *exchange) session0(needed bool) *call.Refusal {
	sid := x.r.Header.Get(mcp.HeaderSessionID)
	peer, _ := identity.ParsePeer(x.r.RemoteAddr)
	g := x.g
	switch {
	case sid != "" && needed:
		switch g.sessions.Check(x.r.Context(), sid, peer) {
		case mcpsessions.NotOwned:
			return call.Refuse(call.CodeSessionNotOwned, "session not found or expired; send initialize to start a new session")
		case mcpsessions.Unknown:
			return call.Refuse(call.CodeNotFound, "session not found or expired; send initialize to start a new session")
		}
		x.sid, x.session = sid, g.sandboxes.open(sid)
		x.session.seen(x.id)
		if _, known := x.session.capabilities(); !known {
			if rec := g.sessions.Record(sid); rec != nil && rec.Initialized {
				x.session.initialized(rec.ClientInfo, rec.Capabilities, rec.ProtocolVersion) // adopted from another replica
			}
		}
		x.out.sid = sid
		x.out.stream = g.events.NewStream()
	case needed:
		return call.Refuse(call.CodeSessionRequired, "Mcp-Session-Id header is required after initialize")
	default:
		cfg := g.opts.Config
		if n := g.sessions.CountPeer(peer); n >= cfg.MaxSessionsPerSandbox {
			return call.Refuse(call.CodeSessionLimit, "sandbox %s has %d live MCP sessions, the limit; end one (DELETE) first", x.id.Key(), n)
		}
		if g.sessions.Count() >= cfg.MaxSessions {
			return call.Refuse(call.CodeSessionLimit, "this replica holds %d MCP sessions, its limit", cfg.MaxSessions)
		}
	}
	return nil
}

// modernRequest reports a request of a session-less protocol revision (2026-07-28 and later),
// which carries no session ID by design.
func modernRequest(r *http.Request) bool {
	v := r.Header.Get(mcp.HeaderProtocolVersion)
	return v != "" && mcp.IsModernProtocol(v)
}

// notFound answers a method of neither revision: method not found (404 on 2026-07-28).
func (x *exchange) notFound(context.Context, call.Grant) (response, call.End) {
	msg := x.rpcError(mcp.METHOD_NOT_FOUND, "Method not found: "+truncate(x.msg.Method, 100), nil)
	if x.modern {
		x.out.status = http.StatusNotFound
	}
	x.cl.Note("method_not_found")
	return x.respond(msg), call.Answered(x.out.statusOr(http.StatusOK))
}

// hiddenRefused answers a refusal of a request for something the caller may not have as if it
// did not exist: JSON-RPC invalid params (MCP's "not found" from 2026-07-28 on; before it,
// resources/read's resource-not-found), whatever hid it. Other refusals are JSON-RPC errors.
func hiddenRefused(x *exchange, rf *call.Refusal) []byte {
	if rf.Class() != call.ClassPolicy && rf.Class() != call.ClassNotFound {
		return x.rpcError(rpcCodeOf(rf), rf.Reason, refusalData{Code: rf.Code})
	}
	switch x.msg.Method {
	case string(mcp.MethodResourcesRead):
		code := codeResourceGone
		if x.modern {
			code = codeInvalidParams
		}
		return x.rpcError(code, "resource not found", map[string]string{"uri": jsonscan.String(x.msg.p.uri)})
	case string(mcp.MethodPromptsGet):
		return x.rpcError(codeInvalidParams, "prompt '"+truncate(jsonscan.String(x.msg.p.name), 100)+"' not found", nil)
	}
	return x.rpcError(codeInvalidParams, "not found", nil)
}

// truncate is s cut to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// A request of 2026-07-28 carries its revision, client info and capabilities in its _meta, and
// repeats its method and target in standard headers (Mcp-Method, Mcp-Name) that gateways route
// on. The gateway routes on the body, and refuses a request whose headers say otherwise before
// anything of it is decided or sent on (JSON-RPC error -32020, HTTP 400, audited as
// header_mismatch), as the revision asks of every intermediary: a header an intermediary
// trusted could otherwise name another tool than the one the server runs. A revision Sandgate
// does not serve is refused with -32022 and the revisions it does (HTTP 400).

// servedModern are the revisions from 2026-07-28 on that the gateway serves.
var servedModern = []string{mcp.ProtocolVersion20260728}

// checkHeaders checks a 2026-07-28 request's revision and standard headers against its body.
func (x *exchange) checkHeaders() *call.Refusal {
	hv := x.r.Header.Get(mcp.HeaderProtocolVersion)
	v := x.meta.version
	switch {
	case x.msg.isRequest() && v == "":
		return call.Refuse(call.CodeBadParams, "Invalid _meta envelope: %s is required", mcp.MetaKeyProtocolVersion)
	case v != "" && hv != v:
		return call.Refuse(call.CodeHeaderMismatch, "Header mismatch: %s header %q does not match the body's %q",
			mcp.HeaderProtocolVersion, truncate(hv, 40), truncate(v, 40))
	case !slices.Contains(servedModern, v):
		return call.Refuse(call.CodeUnsupportedVersion, "Unsupported protocol version: %s", truncate(v, 40))
	case !x.msg.isRequest():
		return nil
	}
	if got := x.r.Header.Get(mcp.HeaderMethod); got != x.msg.Method {
		return call.Refuse(call.CodeHeaderMismatch, "Header mismatch: %s header %q does not match the body's method %q",
			mcp.HeaderMethod, truncate(got, 100), truncate(x.msg.Method, 100))
	}
	name, named := x.headerName()
	if !named {
		return nil
	}
	got, ok := mcp.DecodeHeaderValue(x.r.Header.Get(mcp.HeaderName))
	if !ok || got != name {
		return call.Refuse(call.CodeHeaderMismatch, "Header mismatch: %s header does not match the body's target %q",
			mcp.HeaderName, truncate(name, 100))
	}
	return nil
}

// headerName is what Mcp-Name must say of the request: params.name of tools/call and
// prompts/get, params.uri of resources/read, params.taskId of the tasks extension's requests.
func (x *exchange) headerName() (string, bool) {
	switch mcp.MCPMethod(x.msg.Method) {
	case mcp.MethodToolsCall, mcp.MethodPromptsGet:
		return jsonscan.String(x.msg.p.name), true
	case mcp.MethodResourcesRead:
		return jsonscan.String(x.msg.p.uri), true
	case mcp.MethodTasksGet, mcp.MethodTasksCancel, methodTasksUpdate:
		return jsonscan.String(x.msg.p.taskID), true
	}
	return "", false
}
