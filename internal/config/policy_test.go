package config_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestPolicyBundleAndShadowErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc, wantErr string
	}{
		{"dir and bundle together", "policy:\n  dir: p\n  bundle:\n    file: b.tar.gz\n    public_key_file: k.pem\n",
			"policy.bundle: policy.dir and policy.bundle are mutually exclusive"},
		{"two bundle sources", "policy:\n  bundle:\n    file: b.tar.gz\n    url: https://h/b.tar.gz\n    public_key_file: k.pem\n",
			"policy.bundle: set exactly one of file, url and oci"},
		{"unsigned bundles are not an option", "policy:\n  bundle:\n    file: b.tar.gz\n", "policy.bundle.public_key_file: is required"},
		{"bundle URL that is no URL", "policy:\n  bundle:\n    url: bundles/x\n    public_key_file: k.pem\n", `policy.bundle.url: "bundles/x" is not an http(s) URL`},
		{"OCI reference with a scheme", "policy:\n  bundle:\n    oci: https://ghcr.io/acme/p:1\n    public_key_file: k.pem\n", "policy.bundle.oci:"},
		{"poll interval too short", "policy:\n  bundle:\n    url: https://h/b.tar.gz\n    public_key_file: k.pem\n    poll_interval: 10ms\n", "policy.bundle.poll_interval: must be at least 1s"},
		{"negative shadow queue", "policy:\n  shadow:\n    dir: s\n    queue_size: -1\n", "policy.shadow.queue_size: must be positive"},
		{"decision log upload URL that is no URL", "policy:\n  decision_log:\n    http:\n      url: collector/logs\n", `policy.decision_log.http.url: "collector/logs" is not an http(s) URL`},
		{"negative upload batch", "policy:\n  decision_log:\n    http:\n      url: https://c/logs\n      max_batch: -1\n", "policy.decision_log.http.max_batch: must be positive"},
		{"misspelt bundle field", "policy:\n  bundle:\n    public_key: k.pem\n", `unknown field "policy.bundle.public_key"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestPolicyBundleDefaults(t *testing.T) {
	c, err := config.Parse([]byte("policy:\n  bundle:\n    file: b.tar.gz\n    public_key_file: k.pem\n  shadow:\n    dir: candidate\n"), "/etc/sandgate")
	require.NoError(t, err)
	assert.Equal(t, "", c.Policy.Dir, "no default folder when a bundle is configured")
	assert.Equal(t, "/etc/sandgate/b.tar.gz", c.Policy.Bundle.File)
	assert.Equal(t, "/etc/sandgate/k.pem", c.Policy.Bundle.PublicKeyFile)
	assert.Equal(t, "default", c.Policy.Bundle.KeyID)
	assert.Equal(t, "RS256", c.Policy.Bundle.Algorithm)
	assert.Equal(t, "/etc/sandgate/candidate", c.Policy.Shadow.Dir)

	c, err = config.Parse([]byte("listen:\n  mcp: 127.0.0.1:8080\n"), "/etc/sandgate")
	require.NoError(t, err)
	assert.Equal(t, "/etc/sandgate/policies", c.Policy.Dir)
	assert.False(t, c.Policy.Bundle.Configured())
}
