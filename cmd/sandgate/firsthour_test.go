package main

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serve never falls back to a file of the folder it was started in: without --config (or
// $SANDGATE_CONFIG) it refuses, saying what to pass. It once served examples/sandgate.yaml, a
// demo config, when run from the repository root.
func TestServeWithoutAConfigRefuses(t *testing.T) {
	for _, args := range [][]string{{"serve"}, {"serve", "--check-config"}} {
		code, out, errOut := runCLI(t, nil, args...)
		assert.Equal(t, 2, code, "%v: a usage error", args)
		assert.Empty(t, out)
		assert.Contains(t, errOut, "sandgate serve: no config: pass --config FILE (or set $SANDGATE_CONFIG)")
		assert.Contains(t, errOut, "examples/sandgate.yaml is the local example, which `make run` serves")
	}
	t.Run("$SANDGATE_CONFIG names it", func(t *testing.T) {
		cfg := writeFile(t, t.TempDir(), "sandgate.yaml", "policy: {dir: "+repoPath(t, "policies")+"}\n")
		code, out, errOut := runCLI(t, map[string]string{"SANDGATE_CONFIG": cfg}, "serve", "--check-config")
		assert.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "config "+cfg+" is valid")
	})
}

// A listener whose address is taken (a second `make run` beside the first) fails serve with
// the setting to change: listen.mcp, listen.proxy or listen.admin.
func TestServeNamesTheListenSettingOfAnAddressInUse(t *testing.T) {
	for _, setting := range []string{"mcp", "proxy", "admin"} {
		t.Run(setting, func(t *testing.T) {
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer taken.Close()
			addrs := map[string]string{"mcp": freeAddr(t), "proxy": freeAddr(t), "admin": freeAddr(t)}
			addrs[setting] = taken.Addr().String()
			dir := t.TempDir()
			cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen: {mcp: %q, proxy: %q, admin: %q}\npolicy: {dir: %q}\n"+
				"audit: {file: {dir: %q}}\nshutdown: {delay: 0s}\nlog: {level: error}\n",
				addrs["mcp"], addrs["proxy"], addrs["admin"], repoPath(t, "policies"), filepath.Join(dir, "audit")))
			code, _, errOut := runCLI(t, nil, "serve", "--config", cfg)
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut, fmt.Sprintf("sandgate serve: listen.%s: %s is in use by another process (a second sandgate or make run?): "+
				"stop it, or set listen.%s to a free address", setting, taken.Addr(), setting))
			assert.NoDirExists(t, filepath.Join(dir, "audit"), "the addresses are bound before anything else is opened")
		})
	}
	t.Run("every address in use is named", func(t *testing.T) {
		var addrs []any
		for range 3 {
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer taken.Close()
			addrs = append(addrs, taken.Addr().String())
		}
		dir := t.TempDir()
		cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen: {mcp: %q, proxy: %q, admin: %q}\npolicy: {dir: %q}\n"+
			"audit: {file: {dir: %q}}\nshutdown: {delay: 0s}\n", append(addrs, repoPath(t, "policies"), filepath.Join(dir, "audit"))...))
		code, _, errOut := runCLI(t, nil, "serve", "--config", cfg)
		assert.Equal(t, 1, code)
		for i, setting := range []string{"mcp", "proxy", "admin"} {
			assert.Contains(t, errOut, fmt.Sprintf("listen.%s: %s is in use", setting, addrs[i]))
		}
	})
}

// netpol reading a template with no cluster to read it from says how to render it offline
// (--management), not only client-go's "try setting KUBERNETES_MASTER".
func TestNetpolWithoutAClusterPointsAtManagement(t *testing.T) {
	home := t.TempDir() // no ~/.kube/config
	t.Setenv("HOME", home)
	t.Setenv("KUBECONFIG", writeFile(t, home, "empty-kubeconfig", ""))
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod
	cfg := repoPath(t, "examples/sandgate.yaml")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--template", "agents/coding-agent"}, "without a cluster, render a template offline: sandgate netpol --template agents/coding-agent --management Managed (or Unmanaged)"},
		{nil, "without a cluster, render a template offline: sandgate netpol --template NS/NAME --management Managed (or Unmanaged)"},
	} {
		code, out, errOut := runCLI(t, nil, append([]string{"netpol", "--config", cfg}, tc.args...)...)
		assert.Equal(t, 1, code, "%v", tc.args)
		assert.Empty(t, out)
		assert.Contains(t, errOut, tc.want)
	}
	code, _, errOut := runCLI(t, nil, "netpol", "--config", cfg, "--apply")
	assert.Equal(t, 1, code)
	assert.NotContains(t, errOut, "--management", "applying needs the cluster: no offline hint")
}
