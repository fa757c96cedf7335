package sandgate.egress_test

import data.sandgate_fixtures as fixtures
import data.sandgate_fixtures.coder
import data.sandgate_fixtures.triage

connect(id, host) := fixtures.decide({"kind": "http.connect", "identity": id, "http": {"method": "CONNECT", "host": host, "port": 443}})

request(id, http) := request_in(fixtures.templates, id, http)

request_in(tpls, id, http) := fixtures.decide_in(
	{"kind": "http.request", "identity": id, "http": object.union({"method": "POST", "host": "", "port": 443, "path": "/", "route": "", "model": "", "max_tokens": -1, "stream": false}, http)},
	tpls,
)

test_connect_to_model_host_is_allowed if connect(coder, "api.anthropic.com").allow

test_connect_to_listed_host_is_allowed if connect(coder, "proxy.golang.org").allow

test_connect_to_other_host_is_denied if {
	d := connect(coder, "evil.example.com")
	not d.allow
	d.code == "host_not_allowed"
}

test_connect_to_metadata_is_denied if not connect(coder, "169.254.169.254").allow

test_allowed_model_gets_the_provider_credential if {
	d := request(coder, {"host": "api.anthropic.com", "path": "/v1/messages", "model": "claude-sonnet-4-5", "max_tokens": 1024})
	d.allow
	d.credential == "anthropic"
}

test_route_request_is_decided_by_route_name if {
	d := request(coder, {"route": "anthropic", "host": "api.anthropic.com", "path": "/v1/messages", "model": "claude-haiku-4-5", "max_tokens": 100})
	d.allow
	d.credential == "anthropic"
}

test_model_allowed_for_one_template_is_denied_for_another if {
	d := request(triage, {"route": "anthropic", "model": "claude-sonnet-4-5", "max_tokens": 100})
	not d.allow
	d.code == "model_not_allowed"
	request(coder, {"route": "anthropic", "model": "claude-sonnet-4-5", "max_tokens": 100}).allow
}

test_max_tokens_over_the_cap_is_denied if {
	d := request(triage, {"route": "anthropic", "model": "claude-haiku-4-5", "max_tokens": 4097})
	not d.allow
	d.code == "max_tokens_exceeded"
	request(triage, {"route": "anthropic", "model": "claude-haiku-4-5", "max_tokens": 4096}).allow
}

test_provider_not_in_template_is_denied if {
	d := request(coder, {"route": "openai", "model": "gpt-5", "max_tokens": 10})
	not d.allow
	d.code == "provider_not_allowed"
}

test_plain_request_to_listed_host_is_allowed_without_credential if {
	d := request(coder, {"method": "GET", "host": "proxy.golang.org", "path": "/golang.org/x/net/@v/list"})
	d.allow
	not d.credential
}

test_request_to_unlisted_host_is_denied if not request(coder, {"method": "GET", "host": "example.org"}).allow

test_a_request_without_a_model_says_so if {
	d := request(coder, {"route": "anthropic", "method": "GET", "host": "api.anthropic.com", "path": "/v1/models"})
	not d.allow
	d.code == "model_missing"
}

test_a_messages_request_without_max_tokens_is_refused if {
	d := request(coder, {"route": "anthropic", "host": "api.anthropic.com", "path": "/v1/messages", "model": "claude-haiku-4-5", "max_tokens": -1})
	not d.allow
	d.code == "max_tokens_missing"
}

test_max_tokens_is_optional_where_the_api_says_so if {
	tpls := fixtures.with_template("coder", {"models": {"openai": {"allow": ["gpt-5"], "max_tokens": 1000}}})
	d := request_in(tpls, coder, {"route": "openai", "host": "api.openai.com", "path": "/v1/chat/completions", "model": "gpt-5", "max_tokens": -1})
	d.allow
}

# The route's allow path (request_decision's first branch) is the general one narrowed: a
# request through the route and the same request by host must decide alike, allow or deny.
test_route_and_host_requests_decide_alike if {
	every model in ["claude-sonnet-4-5", "claude-haiku-4-5", "gpt-5", ""] {
		every max_tokens in [-1, 0, 100, 16384, 16385] {
			by_route := request(coder, {"route": "anthropic", "host": "api.anthropic.com", "path": "/v1/messages", "model": model, "max_tokens": max_tokens})
			by_host := request(coder, {"host": "api.anthropic.com", "path": "/v1/messages", "model": model, "max_tokens": max_tokens})
			by_route.allow == by_host.allow
			by_route.code == by_host.code
			object.get(by_route, "credential", "") == object.get(by_host, "credential", "")
		}
	}
}

test_a_route_the_template_has_no_models_for_is_denied if {
	d := request(coder, {"route": "openai", "host": "api.openai.com", "model": "gpt-5", "max_tokens": 10})
	not d.allow
	d.code == "provider_not_allowed"
}

# A plain-HTTP forward request (GET http://host:port/…) is decided on host and port: a listed
# host on port 80, not on its other ports, unless data lists them for the template.
test_plain_http_to_a_listed_host_on_port_80_is_allowed if {
	d := request(coder, {"method": "GET", "host": "proxy.golang.org", "port": 80, "path": "/x/@v/list"})
	d.allow
	d.code == "host_allowed"
}

test_plain_http_to_a_listed_host_on_another_port_is_denied if {
	every port in [8080, 6379, 22, 1, 65535] {
		d := request(coder, {"method": "GET", "host": "proxy.golang.org", "port": port, "path": "/"})
		not d.allow
		d.code == "port_not_allowed"
	}
}

test_a_port_data_lists_for_the_host_is_allowed if {
	tpls := fixtures.with_template("coder", {"ports": {"proxy.golang.org": [8080]}})
	request_in(tpls, coder, {"method": "GET", "host": "proxy.golang.org", "port": 8080}).allow
	d := request_in(tpls, coder, {"method": "GET", "host": "proxy.golang.org", "port": 80})
	not d.allow
	d.code == "port_not_allowed"
	request_in(tpls, coder, {"method": "GET", "host": "registry.npmjs.org", "port": 80}).allow
}

test_a_request_inside_a_tunnel_to_a_listed_host_on_443_is_allowed if {
	request(coder, {"method": "GET", "host": "registry.npmjs.org", "port": 443, "path": "/left-pad"}).allow
}

test_a_host_not_listed_is_denied_on_every_port if {
	every port in [80, 443, 8080] {
		d := request(coder, {"method": "GET", "host": "evil.example.com", "port": port})
		not d.allow
		d.code == "host_not_allowed"
	}
}
