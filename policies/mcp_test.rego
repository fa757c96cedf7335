package sandgate.mcp_test

import data.sandgate_fixtures as fixtures
import data.sandgate_fixtures.coder
import data.sandgate_fixtures.triage

call(id, upstream, tool, args) := fixtures.decide({
	"kind": "mcp.tools_call", "identity": id, "grants": {},
	"mcp": {"upstream": upstream, "tool": tool, "arguments": args},
})

call_with_grants(id, upstream, tool, args, grants) := call_in(fixtures.templates, id, upstream, tool, args, grants)

call_in(tpls, id, upstream, tool, args, grants) := fixtures.decide_in(
	{
		"kind": "mcp.tools_call", "identity": id, "grants": grants,
		"mcp": {"upstream": upstream, "tool": tool, "arguments": args},
	},
	tpls,
)

listed(id, upstream, tool) := fixtures.decide({
	"kind": "mcp.tools_list", "identity": id,
	"mcp": {"upstream": upstream, "tool": tool, "arguments": {}},
})

test_listed_tool_matching_a_pattern_is_shown if listed(coder, "everything", "get-sum").allow

test_tool_outside_the_template_is_hidden if {
	d := listed(triage, "everything", "add")
	not d.allow
	d.code == "tool_not_allowed"
}

test_same_tool_differs_by_template if {
	call(coder, "everything", "add", {"a": 1, "b": 2}).allow
	not call(triage, "everything", "add", {"a": 1, "b": 2}).allow
}

test_tool_of_another_upstream_is_not_allowed_by_name_alone if {
	not call(coder, "jira", "echo", {}).allow
}

test_unknown_template_is_denied if {
	d := call({"template": "nope", "known": true, "labels": {}}, "everything", "echo", {})
	not d.allow
	d.code == "template_unknown"
}

test_grant_scoped_tool_without_grant_is_denied_with_reason if {
	d := call(coder, "github", "create_pull_request", {"owner": "acme", "repo": "api"})
	not d.allow
	d.code == "repo_not_granted"
	contains(d.reason, "acme/api")
}

test_grant_scoped_tool_with_grant_is_allowed if {
	call_with_grants(coder, "github", "create_pull_request", {"owner": "acme", "repo": "api"}, {"github_repos": ["acme/api"]}).allow
}

test_grant_for_another_repo_does_not_help if {
	not call_with_grants(coder, "github", "push_files", {"owner": "acme", "repo": "billing"}, {"github_repos": ["acme/api"]}).allow
}

test_grant_scoped_tool_is_still_listed if listed(coder, "github", "create_pull_request").allow

test_read_tool_needs_no_grant if call(coder, "github", "get_file_contents", {"owner": "acme", "repo": "billing"}).allow

# Two entries for one upstream both apply: the allow of one, the grant_scoped of the other.
test_every_entry_of_an_upstream_applies if {
	tools := [
		{"upstream": "github", "allow": ["get_*"]},
		{"upstream": "github", "allow": ["push_files"], "grant_scoped": ["push_files"]},
	]
	tpls := fixtures.with_template("coder", {"tools": tools})
	call_in(tpls, coder, "github", "get_issue", {}, {}).allow
	d := call_in(tpls, coder, "github", "push_files", {"owner": "acme", "repo": "api"}, {})
	d.code == "repo_not_granted"
	call_in(tpls, coder, "github", "push_files", {"owner": "acme", "repo": "api"}, {"github_repos": ["acme/api"]}).allow
}

# A grant is needed to call a grant-scoped tool, not to read a resource of the same name.
test_only_a_tools_call_needs_a_grant if {
	d := fixtures.decide({
		"kind": "mcp.resources_read", "identity": coder,
		"mcp": {"upstream": "github", "tool": "create_pull_request", "arguments": {}},
	})
	d.allow
}

# Arguments that do not name a repository (missing, not strings) never match a grant.
test_a_grant_scoped_call_without_a_repository_is_not_granted if {
	grants := {"github_repos": ["acme/api", "1/api"]}
	not call_with_grants(coder, "github", "push_files", {"repo": "api"}, grants).allow
	d := call_with_grants(coder, "github", "push_files", {"owner": 1, "repo": "api"}, grants)
	not d.allow
	d.code == "repo_not_granted"
	not call_with_grants(coder, "github", "push_files", {"owner": "acme", "repo": "api"}, {"github_repos": "acme/api"}).allow
}

# Hidden and missing targets: every call is decided, also of a tool the sandbox's list does not
# show (input.mcp.visible false) or that no upstream offers (input.mcp.exists false).
target(id, kind, upstream, tool, exists, visible) := fixtures.decide({
	"kind": kind, "identity": id, "grants": {},
	"mcp": {"upstream": upstream, "tool": tool, "arguments": {}, "exists": exists, "visible": visible},
})

test_a_target_no_upstream_offers_is_not_found_for_every_kind if {
	every kind in ["mcp.tools_call", "mcp.prompts_get", "mcp.resources_read"] {
		d := target(coder, kind, "", "echo", false, false)
		not d.allow
		d.code == "not_found"
		contains(d.reason, "no upstream offers \"echo\"")
	}
}

test_a_hidden_tool_is_decided_by_the_same_rules_and_says_it_was_hidden if {
	d := target(triage, "mcp.tools_call", "everything", "add", true, false)
	not d.allow
	d.code == "tool_not_allowed"
	contains(d.reason, "not in the sandbox's list")
}

# What replay relies on: data that adds the tool allows the logged call of the hidden tool.
test_a_hidden_tool_the_data_now_allows_is_allowed if {
	tpls := fixtures.with_template("triage", {"tools": [{"upstream": "everything", "allow": ["echo", "add"]}]})
	d := fixtures.decide_in(
		{
			"kind": "mcp.tools_call", "identity": triage, "grants": {},
			"mcp": {"upstream": "everything", "tool": "add", "arguments": {}, "exists": true, "visible": false},
		},
		tpls,
	)
	d.allow
}

# Inputs logged before exists and visible were part of the contract decide as before.
test_an_input_without_exists_or_visible_is_a_visible_target if {
	call(triage, "everything", "echo", {}).allow
	d := call(triage, "everything", "add", {})
	d.code == "tool_not_allowed"
	not contains(d.reason, "not in the sandbox's list")
}
