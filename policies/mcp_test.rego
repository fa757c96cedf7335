package sandgate.mcp_test

import data.sandgate

coder := {"namespace": "agents", "sandbox": "sb-1", "template": "coding-agent", "labels": {}, "known": true}

triage := {"namespace": "agents", "sandbox": "sb-2", "template": "triage-agent", "labels": {}, "known": true}

call(id, upstream, tool, args) := d if {
	d := sandgate.decision with input as {
		"kind": "mcp.tools_call", "identity": id, "grants": {},
		"mcp": {"upstream": upstream, "tool": tool, "arguments": args},
	}
}

call_with_grants(id, upstream, tool, args, grants) := d if {
	d := sandgate.decision with input as {
		"kind": "mcp.tools_call", "identity": id, "grants": grants,
		"mcp": {"upstream": upstream, "tool": tool, "arguments": args},
	}
}

listed(id, upstream, tool) := d if {
	d := sandgate.decision with input as {
		"kind": "mcp.tools_list", "identity": id,
		"mcp": {"upstream": upstream, "tool": tool, "arguments": {}},
	}
}

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
	call(coder, "github", "get_issue", {}).allow with data.templates["coding-agent"].tools as tools
	d := call(coder, "github", "push_files", {"owner": "acme", "repo": "api"}) with data.templates["coding-agent"].tools as tools
	d.code == "repo_not_granted"
	call_with_grants(coder, "github", "push_files", {"owner": "acme", "repo": "api"}, {"github_repos": ["acme/api"]}).allow with data.templates["coding-agent"].tools as tools
}

# A grant is needed to call a grant-scoped tool, not to read a resource of the same name.
test_only_a_tools_call_needs_a_grant if {
	d := sandgate.decision with input as {
		"kind": "mcp.resources_read", "identity": coder,
		"mcp": {"upstream": "github", "tool": "create_pull_request", "arguments": {}},
	}
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
