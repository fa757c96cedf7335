package sandgate_test

import data.sandgate_fixtures as fixtures
import data.sandgate_fixtures.coder

test_unknown_caller_is_denied_for_every_kind if {
	every kind in ["mcp.tools_list", "mcp.tools_call", "http.connect", "http.request"] {
		d := fixtures.decide({"kind": kind, "identity": {"known": false, "source_ip": "127.0.0.9"}})
		d.allow == false
		d.code == "unknown_identity"
	}
}

test_unknown_kind_is_denied_by_default if {
	d := fixtures.decide({"kind": "something.else", "identity": coder})
	d.allow == false
	d.code == "default_deny"
}

test_missing_input_is_denied if {
	d := fixtures.decide({})
	d.allow == false
}

test_mcp_kinds_reach_the_mcp_package if {
	d := fixtures.decide({"kind": "mcp.tools_call", "identity": coder, "mcp": {"upstream": "everything", "tool": "echo", "arguments": {}}})
	d.allow == true
	d.code == "tool_allowed"
}

test_http_kinds_reach_the_egress_package if {
	d := fixtures.decide({"kind": "http.connect", "identity": coder, "http": {"host": "api.anthropic.com", "port": 443}})
	d.allow == true
}

# Report-only templates (enforce: false): a denial says so, an allow is unchanged.
test_a_report_only_template_marks_its_denials_not_enforced if {
	d := fixtures.decide({"kind": "http.connect", "identity": fixtures.observer, "http": {"host": "example.org", "port": 443}})
	not d.allow
	d.code == "host_not_allowed"
	d.enforce == false
	a := fixtures.decide({"kind": "mcp.tools_call", "identity": fixtures.observer, "grants": {}, "mcp": {"upstream": "everything", "tool": "echo", "arguments": {}}})
	a.allow
	not "enforce" in object.keys(a)
}

test_an_enforced_template_enforces_its_denials if {
	d := fixtures.decide({"kind": "http.connect", "identity": fixtures.triage, "http": {"host": "example.org", "port": 443}})
	not d.allow
	not "enforce" in object.keys(d)
}

test_report_only_never_applies_to_unknown_callers_or_missing_targets if {
	unknown := object.union(fixtures.observer, {"known": false})
	d := fixtures.decide({"kind": "http.connect", "identity": unknown, "http": {"host": "example.org", "port": 443}})
	d.code == "unknown_identity"
	not "enforce" in object.keys(d)
	m := fixtures.decide({"kind": "mcp.tools_call", "identity": fixtures.observer, "grants": {}, "mcp": {"upstream": "", "tool": "x", "arguments": {}, "exists": false, "visible": false}})
	m.code == "not_found"
	not "enforce" in object.keys(m)
}
