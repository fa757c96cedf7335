package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const proxyCreds = `
credentials:
  - {name: anthropic, env: ANTHROPIC_KEY}
`

func TestProxyDefaults(t *testing.T) {
	c, err := Parse([]byte(proxyCreds+`
proxy:
  ca: {cert: ca/ca.crt, key: ca/ca.key}
  routes:
    - name: anthropic
      upstream: https://api.anthropic.com
      api: anthropic
      credential: {name: anthropic, header: x-api-key, format: "{value}"}
  hosts:
    - host: API.Anthropic.com.
      mode: intercept
      credential: {name: anthropic}
`), "/etc/sandgate")
	require.NoError(t, err)
	p := c.Proxy
	assert.Equal(t, "/etc/sandgate/ca/ca.crt", p.CA.Cert)
	assert.Equal(t, "api.anthropic.com", p.Hosts[0].Host)
	assert.Equal(t, 443, p.Hosts[0].Port)
	assert.Equal(t, APINone, p.Hosts[0].API)
	assert.Equal(t, "Authorization", p.Hosts[0].Credential.Header)
	assert.Equal(t, "Bearer {value}", p.Hosts[0].Credential.Format)
	assert.Equal(t, "x-api-key", p.Routes[0].Credential.Header)
	assert.Equal(t, int64(4<<20), p.Limits.BodyBytes)
	assert.Equal(t, 32<<10, p.Limits.MaxHeaderBytes)
	assert.Equal(t, 64, p.Limits.TunnelsPerSandbox)
	assert.Equal(t, 2*time.Minute, p.Limits.TunnelIdleTimeout.D())
}

func TestProxyValidation(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		field string
	}{
		{"route without name is refused", `routes: [{upstream: "https://a.example"}]`, "proxy.routes[0].name"},
		{"route name with a slash is refused", `routes: [{name: "a/b", upstream: "https://a.example"}]`, "proxy.routes[0].name"},
		{"duplicate route name is refused", `routes: [{name: a, upstream: "https://a.example"}, {name: a, upstream: "https://b.example"}]`, "proxy.routes[1].name"},
		{"route upstream that is not a URL is refused", `routes: [{name: a, upstream: "api.anthropic.com"}]`, "proxy.routes[0].upstream"},
		{"route upstream with user info is refused", `routes: [{name: a, upstream: "https://u:p@a.example"}]`, "proxy.routes[0].upstream"},
		{"route with unknown api kind is refused", `routes: [{name: a, upstream: "https://a.example", api: gemini}]`, "proxy.routes[0].api"},
		{"credential that is not defined is refused", `routes: [{name: a, upstream: "https://a.example", credential: {name: nope}}]`, "proxy.routes[0].credential.name"},
		{"credential format without {value} is refused", `routes: [{name: a, upstream: "https://a.example", credential: {name: anthropic, format: "Bearer x"}}]`, "proxy.routes[0].credential.format"},
		{"credential in the Host header is refused", `routes: [{name: a, upstream: "https://a.example", credential: {name: anthropic, header: Host}}]`, "proxy.routes[0].credential.header"},
		{"credential over plain http is refused", `routes: [{name: a, upstream: "http://a.example", credential: {name: anthropic}}]`, "proxy.routes[0].credential"},
		{"host with a port in the name is refused", `hosts: [{host: "a.example:443", mode: tunnel}]`, "proxy.hosts[0].host"},
		{"host with unknown mode is refused", `hosts: [{host: a.example, mode: bump}]`, "proxy.hosts[0].mode"},
		{"intercepted host without a CA is refused", `hosts: [{host: a.example, mode: intercept}]`, "proxy.hosts[0].mode"},
		{"tunnel with a credential is refused", `hosts: [{host: a.example, mode: tunnel, credential: {name: anthropic}}]`, "proxy.hosts[0].credential"},
		{"duplicate host is refused", `hosts: [{host: a.example, mode: tunnel}, {host: A.example, mode: tunnel}]`, "proxy.hosts[1].host"},
		{"port out of range is refused", `hosts: [{host: a.example, port: 70000, mode: tunnel}]`, "proxy.hosts[0].port"},
		{"denied CIDR that does not parse is refused", `denied_cidrs: ["10.96.0.0"]`, "proxy.denied_cidrs[0]"},
		{"allowed CIDR that does not parse is refused", `allowed_cidrs: ["64:ff9b::"]`, "proxy.allowed_cidrs[0]"},
		{"connect_to without a port in the destination is refused", `connect_to: {api.anthropic.com: "127.0.0.1:8443"}`, `proxy.connect_to["api.anthropic.com"]`},
		{"connect_to to a name instead of an address is refused", `connect_to: {"api.anthropic.com:443": "localhost:8443"}`, `proxy.connect_to["api.anthropic.com:443"]`},
		{"connect_to to an address without a port is refused", `connect_to: {"api.anthropic.com:443": "127.0.0.1"}`, `proxy.connect_to["api.anthropic.com:443"]`},
		{"CA with only a cert is refused", `ca: {cert: ca.crt}`, "proxy.ca"},
		{"tiny header limit is refused", `limits: {max_header_bytes: 10}`, "proxy.limits.max_header_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(proxyCreds+"proxy:\n  "+tt.doc+"\n"), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.field+":")
		})
	}
}
