# Test policy of the gateway's acceptance tests: per template, per upstream, glob patterns of
# the tools (and prompts, resource URIs) a sandbox may use; a tools/call whose argument
# message is "forbidden" is denied with a reason.
package sandgate

default decision := {"allow": false, "reason": "denied by default", "code": "default_deny"}

decision := {"allow": false, "reason": "unknown caller", "code": "unknown_identity"} if {
	not input.identity.known
} else := {"allow": false, "reason": "no upstream offers it", "code": "not_found"} if {
	input.mcp.exists == false
} else := {"allow": false, "reason": "not allowed for this template", "code": "tool_not_allowed"} if {
	not permitted
} else := {"allow": false, "reason": "the message \"forbidden\" may not be echoed", "code": "bad_arguments"} if {
	input.kind == "mcp.tools_call"
	input.mcp.arguments.message == "forbidden"
} else := {"allow": true, "reason": "allowed for template", "code": "allow"}

permitted if {
	some p in data.templates[input.identity.template][input.mcp.upstream]
	glob.match(p, [], input.mcp.tool)
}
