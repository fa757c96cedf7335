# HTTP egress: model APIs and other allowed hosts per sandbox template.
#
# data.templates[T].hosts lists the hosts a sandbox may reach; data.templates[T].models maps a
# model provider (the route name, or the provider of a host in data.providers) to the models
# allowed and a cap on max_tokens. The credential to inject is the provider's.
package sandgate.egress

template := data.templates[input.identity.template]

# The model provider of this request: its base-URL route, else the provider owning the host.
provider := input.http.route if {
	input.http.route != ""
} else := p if {
	some p, prov in data.providers
	input.http.host in prov.hosts
}

host_allowed if input.http.host in template.hosts

host_allowed if {
	some p, _ in template.models
	input.http.host in data.providers[p].hosts
}

# An HTTP request to a listed host (not a model provider's) goes to one of its ports: those
# data.templates[T].ports lists for the host, else 80 (plain HTTP) and 443. The input does not
# say whether a request came as plain HTTP or inside an intercepted tunnel, whose CONNECT the
# proxy opens only to a configured host:port (443 by default); 443 is that port, which reaches
# nothing CONNECT does not. Any other port (an admin or database port on the same host) must
# be listed.
request_ports := template.ports[input.http.host]

default request_ports := [80, 443]

port_allowed if input.http.port in request_ports

models := template.models[provider]

# A tunnel or interception is opened only to a host the template may reach.
connect_decision := {"allow": true, "reason": "host allowed for template", "code": "host_allowed"} if {
	host_allowed
} else := {
	"allow": false,
	"reason": sprintf("host %q is not allowed for template %q", [input.http.host, input.identity.template]),
	"code": "host_not_allowed",
}

# The allow path of a request through a model route comes first and reads data directly (no
# rule of this package is evaluated for it); the general allow path follows, and the reasons
# for a deny are worked out only when neither matches. The first branch is the second one
# narrowed to a route (provider is the route then) and a max_tokens that is present (so
# max_tokens_missing is false): wherever it matches, the second gives the same decision.
request_decision := {
	"allow": true,
	"reason": "model allowed for template",
	"code": "model_allowed",
	"credential": data.providers[input.http.route].credential,
} if {
	input.http.route != ""
	m := data.templates[input.identity.template].models[input.http.route]
	input.http.model in m.allow
	input.http.max_tokens >= 0
	input.http.max_tokens <= m.max_tokens
} else := {
	"allow": true,
	"reason": "model allowed for template",
	"code": "model_allowed",
	"credential": data.providers[provider].credential,
} if {
	m := template.models[provider]
	input.http.model in m.allow
	input.http.max_tokens <= m.max_tokens
	not max_tokens_missing
} else := {"allow": true, "reason": "host allowed for template", "code": "host_allowed"} if {
	not provider
	host_allowed
	port_allowed
} else := request_denial

request_denial := {
	"allow": false,
	"reason": sprintf("port %d of host %q is not allowed for template %q (allowed: %s; list others under ports)", [input.http.port, input.http.host, input.identity.template, concat(", ", [sprintf("%d", [p]) | some p in request_ports])]),
	"code": "port_not_allowed",
} if {
	not provider
	host_allowed
} else := {
	"allow": false,
	"reason": sprintf("host %q is not allowed for template %q", [input.http.host, input.identity.template]),
	"code": "host_not_allowed",
} if {
	not provider
} else := {
	"allow": false,
	"reason": sprintf("model provider %q is not allowed for template %q", [provider, input.identity.template]),
	"code": "provider_not_allowed",
} if {
	not models
} else := {
	"allow": false,
	"reason": sprintf("the request to provider %q names no model: only model requests (a JSON body with \"model\" and \"max_tokens\") are allowed", [provider]),
	"code": "model_missing",
} if {
	input.http.model == ""
} else := {
	"allow": false,
	"reason": sprintf("the request to provider %q has no max_tokens; the provider requires it and template %q caps it at %d", [provider, input.identity.template, models.max_tokens]),
	"code": "max_tokens_missing",
} if {
	max_tokens_missing
} else := {
	"allow": false,
	"reason": sprintf("model %q is not allowed for template %q (allowed: %s)", [input.http.model, input.identity.template, concat(", ", models.allow)]),
	"code": "model_not_allowed",
} if {
	not input.http.model in models.allow
} else := {
	"allow": false,
	"reason": sprintf("max_tokens %d exceeds the cap of %d for template %q", [input.http.max_tokens, models.max_tokens, input.identity.template]),
	"code": "max_tokens_exceeded",
}

# A provider whose API requires max_tokens (requires_max_tokens in data) gets none: Sandgate
# reads -1 for a missing or null max_tokens, which would pass any cap. Where the API makes it
# optional (OpenAI), a request without it is allowed and the provider's default applies.
max_tokens_missing if {
	input.http.max_tokens < 0
	data.providers[provider].requires_max_tokens
}
