// Package gateway is Sandgate's MCP side: one Streamable HTTP endpoint, /mcp, for every
// sandbox, in front of every configured upstream MCP server (Streamable HTTP or stdio), on
// both protocol generations (before 2026-07-28, with sessions; from it, without).
//
// The guard (guard.go) refuses a foreign Host or Origin and an unknown caller (one
// rate-limited mcp.rejected event each); every other request is one call.Run (relay.go): its
// message is read once (message.go), its method's entry in the table (methods.go) asks policy
// what the request asks (tool, prompt or resource, with its arguments) and, once allowed,
// acts: the gateway answers what is its own (initialize, server/discover, the merged lists
// filtered per caller), and relays the rest (forward.go) on the sandbox's upstream session,
// the sandbox's params sent on as written but for the hop's own fields, the upstream's
// answer, notifications and requests back as written, through the response guard.
//
// A tool, prompt or resource the caller may not see answers exactly like one that does not
// exist; a visible tool whose call policy denies returns a tool error with the policy's
// reason. No header of a sandbox's request reaches an upstream; no credential value reaches a
// sandbox. See docs/mcp-gateway.md.
package gateway
