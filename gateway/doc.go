// Package gateway is Sandgate's MCP side: one Streamable HTTP endpoint, /mcp, for every
// sandbox, in front of every configured upstream MCP server (Streamable HTTP or stdio).
//
// Every request follows the one request path of internal/call, which the egress proxy shares:
// the guard (guard.go) resolves identity from the TCP peer address, refuses what it must
// (Host/Origin allow-list, unknown callers, content type, body limit, batches, session checks:
// one mcp.rejected event each) and begins the request's call; the handler of its method fills
// in target and decision (authorize.go: call.Authorize with admission, then forward with the
// upstream's credential); the guard ends the call when mcp-go has answered: exactly one audit
// event per HTTP request, whatever its method.
//
// What a sandbox sees: the merged tools, prompts, resources and resource templates of the
// upstreams that are connected, filtered per caller by policy (mcp.tools_list,
// mcp.prompts_get, mcp.resources_read). A tool, prompt or resource the caller may not see
// answers exactly like one that does not exist. A visible tool whose call policy denies
// (mcp.tools_call, decided with the arguments) returns a tool error result carrying the
// policy's reason.
//
// What never reaches an upstream: any header of the sandbox's request, Authorization included.
// Upstream requests are built by Sandgate and carry only the configured credential. What never
// reaches a sandbox: credential values. Everything an upstream declares (tools with their
// schemas, annotations, _meta and icons; prompts, resources, templates) and returns (content,
// structuredContent) reaches the sandbox verbatim, renamed only where a prefix applies
// (verbatim.go); notifications about a call precede its result; progress comes back under the
// sandbox's own token; a cancelled call is cancelled upstream.
//
// Upstream sessions: each sandbox session gets its own session on a stateful HTTP upstream
// (upstream_sessions.go), or all share one (sessions: shared); see docs/mcp-gateway.md.
package gateway
