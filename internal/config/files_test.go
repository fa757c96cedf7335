package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestCheckFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "policies"), 0o755))
	podOnly := "credentials:\n  - {name: k, file: /nonexistent/k}\n" +
		"proxy:\n  ca: {cert: /nonexistent/ca.crt, key: /nonexistent/ca.key}\n" +
		"kubernetes:\n  kubeconfig: /nonexistent/kubeconfig\n" +
		"gateway:\n  upstreams:\n    - {name: a, command: no-such-mcp-server-in-path}\n"
	cases := []struct {
		name    string
		doc     string
		offline bool
		wantErr []string // empty: no error
	}{
		{name: "audit folder that exists", doc: "audit: {file: {dir: " + dir + "}}\n"},
		{name: "audit folder that can be created", doc: "audit: {file: {dir: " + filepath.Join(dir, "var", "audit") + "}}\n"},
		{name: "audit folder that is a file", doc: "audit: {file: {dir: " + file + "}}\n",
			wantErr: []string{"audit.file.dir: " + file + " is a file, not a folder"}},
		{name: "audit folder under a file", doc: "audit: {file: {dir: " + filepath.Join(file, "audit") + "}}\n",
			wantErr: []string{"audit.file.dir: cannot create " + filepath.Join(file, "audit") + ": " + file + " is a file"}},
		{name: "policy folder that is a file", doc: "policy: {dir: " + file + "}\n",
			wantErr: []string{"policy.dir: " + file + " is a file, not a folder of .rego files"}},
		{name: "every pod-only file missing is reported, each by its field", doc: podOnly, wantErr: []string{
			"credentials[0].file: /nonexistent/k: no such file or directory",
			"proxy.ca.cert: /nonexistent/ca.crt: no such file or directory",
			"proxy.ca.key: /nonexistent/ca.key: no such file or directory",
			"kubernetes.kubeconfig: /nonexistent/kubeconfig: no such file or directory",
			`gateway.upstreams[0].command: "no-such-mcp-server-in-path": executable file not found in $PATH`,
		}},
		{name: "offline skips the files only the pod has", doc: podOnly + "policy: {dir: /nonexistent/policies}\n", offline: true},
		{name: "audit reserve larger than the volume", doc: "audit: {file: {dir: " + filepath.Join(dir, "var", "audit") + ", reserve_mb: 1073741824}}\n",
			wantErr: []string{"audit.file.reserve_mb: 1073741824 MiB is more than the whole volume holding " + filepath.Join(dir, "var", "audit")}},
		{name: "offline does not know the pod's volume", doc: "audit: {file: {dir: " + dir + ", reserve_mb: 1073741824}}\n", offline: true},
		{name: "offline still checks the audit folder", doc: "audit: {file: {dir: " + file + "}}\n", offline: true,
			wantErr: []string{"audit.file.dir: " + file + " is a file, not a folder"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(tc.doc), dir)
			require.NoError(t, err)
			err = c.CheckFiles(tc.offline)
			if len(tc.wantErr) == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, want := range tc.wantErr {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}
