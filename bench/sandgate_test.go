package bench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestOmitKeys(t *testing.T) {
	cfg := "listen: {mcp: a}\nshutdown: {delay: 0s}\ngateway:\n  upstreams:\n    - {name: x}\n\nproxy:\n  routes: []\nlog: {level: warn}\n"
	assert.Equal(t, cfg, omitKeys(cfg, nil))
	assert.Equal(t, "listen: {mcp: a}\ngateway:\n  upstreams:\n    - {name: x}\n\nproxy:\n  routes: []\nlog: {level: warn}\n",
		omitKeys(cfg, []string{"shutdown"}))
	assert.Equal(t, "listen: {mcp: a}\nshutdown: {delay: 0s}\nlog: {level: warn}\n",
		omitKeys(cfg, []string{"gateway", "proxy"}), "a key's block goes with it, the blank line inside it too")
}

// The baseline's config without shutdown is still a config Sandgate loads, with the default
// delay; the one the bench writes for its own build sets a delay of 0.
func TestBaselineConfigOmitsKeys(t *testing.T) {
	up := &Upstreams{TLSAddr: "127.0.0.50:8443", HTTPAddr: "127.0.0.50:8080", MCPURL: "http://127.0.0.50:8081/mcp"}
	for _, tc := range []struct {
		omit      []string
		zeroDelay bool
	}{{nil, true}, {[]string{"shutdown"}, false}} {
		dir := t.TempDir()
		path, _, _, _, err := sandgateFiles(dir, filepath.Join("..", "policies"), up, 2, variant{name: "baseline", omit: tc.omit})
		require.NoError(t, err)
		cfg, err := config.Load(path)
		require.NoError(t, err, "omit %v", tc.omit)
		d := cfg.Shutdown.Delay
		assert.Equal(t, tc.zeroDelay, d != nil && d.D() == 0, "omit %v: shutdown delay %v", tc.omit, d)
	}
}

// The "minted" target's config loads, with the route's credential minted per run under the
// name the shipped policy's decision names (a policy naming another would be refused).
func TestMintedVariantConfigLoads(t *testing.T) {
	up := &Upstreams{TLSAddr: "127.0.0.50:8443", HTTPAddr: "127.0.0.50:8080", MCPURL: "http://127.0.0.50:8081/mcp"}
	v := mintedVariant
	v.credentials = fmt.Sprintf(v.credentials, "http://"+up.HTTPAddr+tokenPath)
	path, _, _, _, err := sandgateFiles(t.TempDir(), filepath.Join("..", "policies"), up, 2, v)
	require.NoError(t, err)
	cfg, err := config.Load(path)
	require.NoError(t, err)
	require.Len(t, cfg.Proxy.Routes, 1)
	assert.Equal(t, "anthropic", cfg.Proxy.Routes[0].Credential.Name)
	for _, c := range cfg.Credentials {
		assert.Equal(t, c.Name == "anthropic", c.Minted(), c.Name)
	}
}
