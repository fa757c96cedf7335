# Sandgate's entry point. Every call is decided by data.sandgate.decision; the result is
# {"allow": bool, "reason": string, "code": string, "credential": string?, "enforce": bool?}.
#
# Deny is the default. An unknown caller (an address that maps to no sandbox) is denied before
# any other rule runs; MCP calls go to package sandgate.mcp, HTTP egress to sandgate.egress.
#
# Each verdict rule body starts with equality tests on input.identity.known and input.kind: OPA
# indexes those, so a call evaluates only the one rule that matches it (keep new rules in this
# form).
package sandgate

# A template in report-only mode (data.templates[T].enforce is false) has its denials marked
# "enforce": false: Sandgate lets such a call through and records the denial it would have
# made (audit event decision.would_deny, sandgate_policy_report_only_total, `policy suggest`).
# Never for an unknown caller, and never for a target that does not exist.
decision := verdict if not report_only

decision := object.union(verdict, {"enforce": false}) if report_only

report_only if {
	input.identity.known == true
	data.templates[input.identity.template].enforce == false
	verdict.allow == false
	not input.mcp.exists == false
}

default verdict := {
	"allow": false,
	"reason": "denied by default: no rule allows this call",
	"code": "default_deny",
}

verdict := {
	"allow": false,
	"reason": "unknown caller: the source address maps to no sandbox",
	"code": "unknown_identity",
} if {
	input.identity.known == false
}

verdict := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.tools_list"
}

verdict := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.tools_call"
}

verdict := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.resources_read"
}

verdict := data.sandgate.mcp.decision if {
	input.identity.known == true
	input.kind == "mcp.prompts_get"
}

verdict := data.sandgate.egress.connect_decision if {
	input.identity.known == true
	input.kind == "http.connect"
}

verdict := data.sandgate.egress.request_decision if {
	input.identity.known == true
	input.kind == "http.request"
}
