package gateway

import (
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
)

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
	case !isServedModern(v):
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
		return stringOf(x.msg.p.name), true
	case mcp.MethodResourcesRead:
		return stringOf(x.msg.p.uri), true
	case mcp.MethodTasksGet, mcp.MethodTasksCancel, methodTasksUpdate:
		return stringOf(x.msg.p.taskID), true
	}
	return "", false
}

func isServedModern(v string) bool {
	for _, s := range servedModern {
		if v == s {
			return true
		}
	}
	return false
}
