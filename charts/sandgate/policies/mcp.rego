# MCP tools, resources and prompts per sandbox template.
#
# data.templates[T].tools lists, per upstream, glob patterns of the tools a sandbox of template T
# may see and call. Tools listed under grant_scoped additionally need a grant: the call's
# arguments.owner/arguments.repo must name a repository in input.grants.github_repos, which the
# dispatcher registers for the session through the admin API.
#
# Every call is decided, also one of a target the sandbox cannot see (input.mcp.visible is
# false) or that no upstream offers (input.mcp.exists is false): the sandbox gets the same "not
# found" for both, and the decision on record says which it was. A hidden target is decided by
# the same rules as a visible one, so that a replay under data that adds the tool shows the call
# as allowed.
package sandgate.mcp

template := data.templates[input.identity.template]

# The allow path is one rule body that reads data directly (no intermediate set of the
# template's entries is built); the reasons for a deny are worked out only when it fails.
decision := {
	"allow": false,
	"reason": sprintf("no upstream offers %q", [input.mcp.tool]),
	"code": "not_found",
} if {
	input.mcp.exists == false
} else := {"allow": true, "reason": "tool allowed for template", "code": "tool_allowed"} if {
	some entry in template.tools
	entry.upstream == input.mcp.upstream
	some p in entry.allow
	glob.match(p, [], input.mcp.tool)
	grant_ok
} else := {
	"allow": false,
	"reason": sprintf("template %q has no MCP rules", [input.identity.template]),
	"code": "template_unknown",
} if {
	not template
} else := {
	"allow": false,
	"reason": sprintf("tool %q of upstream %q is not allowed for template %q%s", [input.mcp.tool, input.mcp.upstream, input.identity.template, hidden_note]),
	"code": "tool_not_allowed",
} if {
	not tool_permitted
} else := {
	"allow": false,
	"reason": sprintf("repository %q is not granted to this session", [repo]),
	"code": "repo_not_granted",
}

tool_permitted if {
	some entry in template.tools
	entry.upstream == input.mcp.upstream
	some p in entry.allow
	glob.match(p, [], input.mcp.tool)
}

# A call has the grant it would need, or needs none (only a tools/call of a grant-scoped tool
# does: listing one shows it). Three definitions, not the negation of a "grant missing" rule, so
# evaluation stops at the first that holds; the grant comes first because reading it is cheaper
# than matching the grant_scoped patterns.
grant_ok if sprintf("%s/%s", [input.mcp.arguments.owner, input.mcp.arguments.repo]) in input.grants.github_repos

grant_ok if not input.kind == "mcp.tools_call"

grant_ok if not grant_scoped

grant_scoped if {
	some entry in template.tools
	entry.upstream == input.mcp.upstream
	some p in entry.grant_scoped
	glob.match(p, [], input.mcp.tool)
}

repo := sprintf("%s/%s", [input.mcp.arguments.owner, input.mcp.arguments.repo])

# A denied call of a target the sandbox's list does not show was answered "not found".
hidden_note := " (not in the sandbox's list: answered as not found)" if input.mcp.visible == false

default hidden_note := ""
