# The data the shipped tests check the rules against: fixtures of their own, not data.yaml, so
# that editing data.yaml (adding a tool, a host, a model) breaks no test. Each test evaluates
# with `with data.templates as fixtures.templates with data.providers as fixtures.providers`
# (the helpers in the *_test.rego files do it). data_test.rego checks data.yaml's shape.
package sandgate_fixtures

providers := {
	"anthropic": {"hosts": ["api.anthropic.com"], "credential": "anthropic", "requires_max_tokens": true},
	"openai": {"hosts": ["api.openai.com"], "credential": "openai"},
}

templates := {
	"coder": {
		"tools": [
			{"upstream": "everything", "allow": ["echo", "add", "get-*", "sample*", "long*"]},
			{
				"upstream": "github",
				"allow": ["get_*", "list_*", "search_*", "create_pull_request", "create_branch", "push_files"],
				"grant_scoped": ["create_pull_request", "create_branch", "push_files"],
			},
		],
		"hosts": ["proxy.golang.org", "registry.npmjs.org"],
		"ports": {},
		"models": {"anthropic": {"allow": ["claude-sonnet-4-5", "claude-haiku-4-5"], "max_tokens": 16384}},
	},
	"triage": {
		"tools": [
			{"upstream": "everything", "allow": ["echo"]},
			{"upstream": "github", "allow": ["get_issue", "list_issues", "search_issues"]},
		],
		"hosts": [],
		"models": {"anthropic": {"allow": ["claude-haiku-4-5"], "max_tokens": 4096}},
	},
	# Report-only: its denials are marked "enforce": false.
	"observer": {
		"enforce": false,
		"tools": [{"upstream": "everything", "allow": ["echo"]}],
		"hosts": [],
		"models": {},
	},
}

coder := {"namespace": "agents", "sandbox": "sb-1", "template": "coder", "claim": "c-1", "labels": {}, "source_ip": "127.0.0.2", "known": true}

triage := {"namespace": "agents", "sandbox": "sb-2", "template": "triage", "labels": {}, "known": true}

observer := {"namespace": "agents", "sandbox": "sb-3", "template": "observer", "labels": {}, "known": true}

# decide is data.sandgate.decision for input under the fixtures.
decide(doc) := d if {
	d := data.sandgate.decision with input as doc with data.templates as templates with data.providers as providers
}

# decide_in is decide with templates in place of the fixtures' (a test's variation of them).
decide_in(doc, tpls) := d if {
	d := data.sandgate.decision with input as doc with data.templates as tpls with data.providers as providers
}

# with_template is the fixtures' templates with template name's fields replaced by those of patch.
with_template(name, patch) := object.union(templates, {name: object.union(templates[name], patch)})
