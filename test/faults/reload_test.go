package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// policyFiles is the shipped policies (tests left out) with their data; echo is allowed to
// the coding-agent template or, with allowEcho false, left out of its allow list.
func policyFiles(t *testing.T, allowEcho bool) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	regos, err := filepath.Glob("../../policies/*.rego")
	require.NoError(t, err)
	for _, f := range append(regos, "../../policies/data.yaml") {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		files[filepath.Base(f)] = b
	}
	if !allowEcho {
		data := string(files["data.yaml"])
		edited := strings.Replace(data, `allow: ["echo", "add", "get-*", "sample*", "long*"]`, `allow: ["add", "get-*", "sample*", "long*"]`, 1)
		require.NotEqual(t, data, edited, "policies/data.yaml changed: update the edit this test makes")
		files["data.yaml"] = []byte(edited)
	}
	return files
}

func writePolicy(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
}

// The three ways a policy folder is replaced in the field (the policy package's watch tests do
// each 100 times against the engine; here the real binary does each a few times under calls).
var replacements = []struct {
	name  string
	setup func(t *testing.T, dir string, files map[string][]byte)
	next  func(t *testing.T, dir string, n int, files map[string][]byte)
}{
	{"ConfigMap ..data symlink swap", func(t *testing.T, dir string, files map[string][]byte) {
		require.NoError(t, os.Mkdir(dir, 0o755))
		configMapSwap(t, dir, 0, files)
	}, configMapSwap},
	{"rm -rf and recreate", writePolicy, func(t *testing.T, dir string, _ int, files map[string][]byte) {
		require.NoError(t, os.RemoveAll(dir))
		writePolicy(t, dir, files)
	}},
	{"new folder moved over the old one", writePolicy, func(t *testing.T, dir string, _ int, files map[string][]byte) {
		writePolicy(t, dir+".new", files)
		require.NoError(t, os.Rename(dir, dir+".old"))
		require.NoError(t, os.Rename(dir+".new", dir))
		require.NoError(t, os.RemoveAll(dir+".old"))
	}},
}

// configMapSwap writes files as kubelet updates a ConfigMap volume: a new timestamped folder,
// ..data_tmp renamed over ..data, the visible names symlinks through ..data.
func configMapSwap(t *testing.T, dir string, n int, files map[string][]byte) {
	t.Helper()
	ts := fmt.Sprintf("..2026_11_30_%06d", n)
	writePolicy(t, filepath.Join(dir, ts), files)
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	require.NoError(t, os.Symlink(ts, filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); os.IsNotExist(err) {
			require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)))
		}
	}
	if old != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(dir, old)))
	}
}

// TestReloadFollowsTheFolder: the real binary serves calls while its policy folder is replaced
// each way, alternating a policy that allows echo and one that hides it; every replacement is
// applied (the sandbox's next calls see it), readiness never reports a reload failure, and
// every answer has its event.
func TestReloadFollowsTheFolder(t *testing.T) {
	const rounds = 4
	for _, r := range replacements {
		t.Run(r.name, func(t *testing.T) {
			up := startUpstream(t, "everything", 0)
			dir := filepath.Join(t.TempDir(), "policies")
			allow, hide := policyFiles(t, true), policyFiles(t, false)
			r.setup(t, dir, allow)
			g := startGateOn(t, fmt.Sprintf("{dir: %q, poll_interval: 1s}", dir), upstreamsConfig(up.URL))
			sb := g.connect(coder1)
			echoServed := func() bool {
				ok, text, err := sb.call("echo", map[string]any{"message": "hi"})
				return err == nil && ok && text == "hi"
			}
			require.True(t, echoServed(), "echo is allowed by the first policy")
			for n := 1; n <= rounds; n++ {
				want := n%2 == 0 // odd rounds hide echo, even rounds allow it again
				files := hide
				if want {
					files = allow
				}
				r.next(t, dir, n, files)
				g.eventually(fmt.Sprintf("replacement %d applied (echo served: %v)", n, want), func() bool { return echoServed() == want })
				code, body := g.readyz()
				assert.Equal(t, 200, code, "replacement %d: %v", n, body)
				assert.NotContains(t, fmt.Sprint(body["degraded"]), "policy", "replacement %d: %v", n, body)
			}
			assert.Zero(t, g.metric("sandgate_policy_reload_failures_total"), "no reload failed: %v", g.logLines("reload"))
			g.requireOneEventPerAnswer(g.events())
		})
	}
}
