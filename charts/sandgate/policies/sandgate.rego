# Sandgate's entry point. Every call is decided by data.sandgate.decision; the result is
# {"allow": bool, "reason": string, "code": string, "credential": string?}.
#
# Deny is the default. An unknown caller (an address that maps to no sandbox) is denied before
# any other rule runs; MCP calls go to package sandgate.mcp, HTTP egress to sandgate.egress.
#
# Each rule body starts with equality tests on input.identity.known and input.kind: OPA indexes
# those, so a call evaluates only the one rule that matches it (keep new rules in this form).
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
	input.identity.known == false
}

decision := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.tools_list"
}

decision := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.tools_call"
}

decision := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.resources_read"
}

decision := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.prompts_get"
}

decision := data.sandgate.egress.connect_decision if {
	input.identity.known == true
	input.kind == "http.connect"
}

decision := data.sandgate.egress.request_decision if {
	input.identity.known == true
	input.kind == "http.request"
}
