package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const gatewayCreds = `
credentials:
  - {name: github, env: GITHUB_TOKEN}
  - {name: jira, env: JIRA_TOKEN}
`

func TestGatewayDefaults(t *testing.T) {
	c, err := Parse([]byte(gatewayCreds+`
gateway:
  upstreams:
    - name: github
      url: https://mcp.example/mcp
      credential: {name: github}
    - name: jira
      url: https://jira.example/mcp
      credential: {name: jira, header: X-Api-Key}
    - name: everything
      command: bin/mcp-upstream
      credential_env: {TOKEN: jira}
`), "/etc/sandgate")
	require.NoError(t, err)
	g := c.Gateway
	assert.Equal(t, []string{"sandgate"}, g.AllowedHosts)
	assert.Equal(t, int64(4<<20), g.MaxBodyBytes)
	assert.Equal(t, 30*time.Minute, g.SessionIdleTimeout.D())
	assert.Equal(t, PrefixOnConflict, g.Upstreams[0].Prefix)
	assert.Equal(t, "Authorization", g.Upstreams[0].Credential.Header)
	assert.Equal(t, "Bearer {value}", g.Upstreams[0].Credential.Format)
	assert.Equal(t, "{value}", g.Upstreams[1].Credential.Format)
	assert.Equal(t, 60*time.Second, g.Upstreams[0].CallTimeout.D())
	assert.Equal(t, 10*time.Second, g.Upstreams[0].ConnectTimeout.D())
	assert.Equal(t, 5, g.Upstreams[0].Breaker.Failures)
	assert.Equal(t, 10*time.Second, g.Upstreams[0].Breaker.OpenFor.D())
	assert.Equal(t, "/etc/sandgate/bin/mcp-upstream", g.Upstreams[2].Command)
	assert.True(t, g.Upstreams[2].IsStdio())
	assert.Equal(t, SessionsPerSandbox, g.Upstreams[2].Sessions)
	assert.Equal(t, 256, g.Upstreams[0].MaxSessions, "an HTTP upstream session")
	assert.Equal(t, 32, g.Upstreams[2].MaxSessions, "a stdio upstream session is a process")
	assert.Equal(t, int64(16<<20), g.Upstreams[0].MaxMessageBytes)
	assert.Equal(t, int64(64<<20), g.Upstreams[0].MaxResponseBytes)
	assert.Equal(t, 1000.0, g.Upstreams[2].MaxNotificationRate)
	assert.Equal(t, UnpinnedAllow, g.Unpinned, "a config without pins keeps working")
}

func TestGatewayValidation(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		field string
	}{
		{"upstream without name is refused", `upstreams: [{url: "https://a.example/mcp"}]`, "gateway.upstreams[0].name"},
		{"upstream name with a dot is refused", `upstreams: [{name: a.b, url: "https://a.example/mcp"}]`, "gateway.upstreams[0].name"},
		{"duplicate upstream name is refused", `upstreams: [{name: a, url: "https://a.example"}, {name: a, url: "https://b.example"}]`, "gateway.upstreams[1].name"},
		{"upstream with both url and command is refused", `upstreams: [{name: a, url: "https://a.example", command: x}]`, "gateway.upstreams[0]"},
		{"upstream with neither url nor command is refused", `upstreams: [{name: a}]`, "gateway.upstreams[0]"},
		{"upstream url that is not http is refused", `upstreams: [{name: a, url: "ftp://a.example"}]`, "gateway.upstreams[0].url"},
		{"upstream url with user info is refused", `upstreams: [{name: a, url: "https://u:p@a.example"}]`, "gateway.upstreams[0].url"},
		{"unknown prefix mode is refused", `upstreams: [{name: a, url: "https://a.example", prefix: sometimes}]`, "gateway.upstreams[0].prefix"},
		{"unknown session model is refused", `upstreams: [{name: a, url: "https://a.example", sessions: per-call}]`, "gateway.upstreams[0].sessions"},
		{"negative max_sessions is refused", `upstreams: [{name: a, url: "https://a.example", max_sessions: -1}]`, "gateway.upstreams[0].max_sessions"},
		{"a message bound under 1 KiB is refused", `upstreams: [{name: a, url: "https://a.example", max_message_bytes: 10}]`, "gateway.upstreams[0].max_message_bytes"},
		{"a response bound under the message bound is refused", `upstreams: [{name: a, url: "https://a.example", max_message_bytes: 4096, max_response_bytes: 2048}]`, "gateway.upstreams[0].max_response_bytes"},
		{"a negative notification rate is refused", `upstreams: [{name: a, url: "https://a.example", max_notification_rate: -1}]`, "gateway.upstreams[0].max_notification_rate"},
		{"negative breaker failures are refused", `upstreams: [{name: a, url: "https://a.example", breaker: {failures: -1}}]`, "gateway.upstreams[0].breaker.failures"},
		{"undefined credential is refused", `upstreams: [{name: a, url: "https://a.example", credential: {name: nope}}]`, "gateway.upstreams[0].credential.name"},
		{"credential format without {value} is refused", `upstreams: [{name: a, url: "https://a.example", credential: {name: github, format: "Bearer x"}}]`, "gateway.upstreams[0].credential.format"},
		{"credential header with a space is refused", `upstreams: [{name: a, url: "https://a.example", credential: {name: github, header: "X Key"}}]`, "gateway.upstreams[0].credential.header"},
		{"header credential on a stdio upstream is refused", `upstreams: [{name: a, command: x, credential: {name: github}}]`, "gateway.upstreams[0].credential"},
		{"env credential that is not defined is refused", `upstreams: [{name: a, command: x, credential_env: {TOKEN: nope}}]`, "gateway.upstreams[0].credential_env.TOKEN"},
		{"args on an HTTP upstream are refused", `upstreams: [{name: a, url: "https://a.example", args: ["-v"]}]`, "gateway.upstreams[0]"},
		{"tiny body limit is refused", `max_body_bytes: 10`, "gateway.max_body_bytes"},
		{"sub-second idle timeout is refused", `session_idle_timeout: 10ms`, "gateway.session_idle_timeout"},
		{"allowed host with a port is refused", `allowed_hosts: ["sandgate:8080"]`, "gateway.allowed_hosts[0]"},
		{"allowed origin without scheme is refused", `allowed_origins: ["app.example.com"]`, "gateway.allowed_origins[0]"},
		{"an unpinned mode that is not allow or hide is refused", `unpinned: warn`, "gateway.unpinned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(gatewayCreds+"gateway:\n  "+tt.doc+"\n"), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.field+":")
		})
	}
}

func TestGatewayUnpinned(t *testing.T) {
	c, err := Parse([]byte("gateway: {unpinned: hide}\n"), "/etc/sandgate")
	require.NoError(t, err)
	assert.Equal(t, UnpinnedHide, c.Gateway.Unpinned)
	_, err = Parse([]byte("policy: {bundle: {file: b.tar.gz, public_key_file: k.pem}}\ngateway: {unpinned: hide}\n"), "/etc/sandgate")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gateway.unpinned: hide needs the pins file of policy.dir")
}
