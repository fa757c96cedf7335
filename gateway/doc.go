// Package gateway is Sandgate's MCP side: one Streamable HTTP endpoint, /mcp, for every
// sandbox, in front of every configured upstream MCP server (Streamable HTTP or stdio).
//
// Every request follows one path: guard (Host/Origin allow-list, content type, body limit,
// batches and session checks) → identity from the TCP peer address → policy decision → forward
// with the upstream's credential → exactly one audit event.
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
