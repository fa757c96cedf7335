package sandgate_test

import data.sandgate

coder := {"namespace": "agents", "sandbox": "sb-1", "template": "coding-agent", "claim": "c-1", "labels": {}, "source_ip": "127.0.0.2", "known": true}

test_unknown_caller_is_denied_for_every_kind if {
	every kind in ["mcp.tools_list", "mcp.tools_call", "http.connect", "http.request"] {
		d := sandgate.decision with input as {"kind": kind, "identity": {"known": false, "source_ip": "127.0.0.9"}}
		d.allow == false
		d.code == "unknown_identity"
	}
}

test_unknown_kind_is_denied_by_default if {
	d := sandgate.decision with input as {"kind": "something.else", "identity": coder}
	d.allow == false
	d.code == "default_deny"
}

test_missing_input_is_denied if {
	d := sandgate.decision with input as {}
	d.allow == false
}

test_mcp_kinds_reach_the_mcp_package if {
	d := sandgate.decision with input as {"kind": "mcp.tools_call", "identity": coder, "mcp": {"upstream": "everything", "tool": "echo", "arguments": {}}}
	d.allow == true
	d.code == "tool_allowed"
}

test_http_kinds_reach_the_egress_package if {
	d := sandgate.decision with input as {"kind": "http.connect", "identity": coder, "http": {"host": "api.anthropic.com", "port": 443}}
	d.allow == true
}
