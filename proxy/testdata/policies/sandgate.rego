# Sandgate's entry point. Every call is decided by data.sandgate.decision; the result is
# {"allow": bool, "reason": string, "code": string, "credential": string?}.
#
# Deny is the default. An unknown caller (an address that maps to no sandbox) is denied before
# any other rule runs; MCP calls go to package sandgate.mcp, HTTP egress to sandgate.egress.
package sandgate

default decision := {
	"allow": false,
	"reason": "denied by default: no rule allows this call",
	"code": "default_deny",
}

decision := {
	"allow": false,
	"reason": "unknown caller: the source address maps to no sandbox",
	"code": "unknown_identity",
} if {
	not input.identity.known
} else := data.sandgate.mcp.decision if {
	startswith(input.kind, "mcp.")
} else := data.sandgate.egress.decision if {
	startswith(input.kind, "http.")
}
