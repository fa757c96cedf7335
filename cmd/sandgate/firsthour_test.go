package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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

// README's "admin API (…)" lists, as paths, exactly what the admin listener serves under /v1/:
// it once promised a "reload" call that never existed.
func TestTheREADMEsAdminAPIIsTheAdminAPI(t *testing.T) {
	readme, err := os.ReadFile(repoPath(t, "README.md"))
	require.NoError(t, err)
	m := regexp.MustCompile(`admin API \(([^)]*)\)`).FindSubmatch(readme)
	require.NotNil(t, m, `README.md names the admin API as "admin API (…)"`)
	named := regexp.MustCompile("`(/v1/[^`]*)`").FindAllSubmatch(m[1], -1)
	require.NotEmpty(t, named, "README's admin API names its paths: %q", m[1])

	dir := t.TempDir()
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen: {admin: %q}\npolicy: {dir: %q}\naudit: {file: {dir: %q}}\n"+
		"shutdown: {delay: 0s}\ncredentials: [{name: admin-token, env: ADMIN_TOKEN}]\nadmin: {token_credential: admin-token}\n",
		admin, repoPath(t, "policies"), filepath.Join(dir, "audit")))
	startServe(t, cfg, envWith("ADMIN_TOKEN", "a-token-long-enough-for-the-admin-api"))
	status := func(path string) int {
		var code int
		require.Eventually(t, func() bool {
			resp, err := http.Post("http://"+admin+path, "application/json", strings.NewReader("{}"))
			if err != nil {
				return false
			}
			resp.Body.Close()
			code = resp.StatusCode
			return true
		}, 10*time.Second, 20*time.Millisecond)
		return code
	}
	for _, p := range named {
		assert.NotEqual(t, http.StatusNotFound, status(string(p[1])+"agents/claims/c/x"), "README names %s: the admin listener serves it", p[1])
	}
	assert.Equal(t, http.StatusNotFound, status("/v1/reload"), "the test tells a served path from one that is not")
}
