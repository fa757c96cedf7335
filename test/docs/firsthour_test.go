package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkRunOutput: make run's build says what it made, and serve says once that it is ready,
// with where to reach it.
func checkRunOutput(t *testing.T, tr *tour) {
	out := tr.log.String()
	assert.Contains(t, out, "make build: bin/sandgate, bin/mcp-upstream and bin/model-api (")
	assert.Equal(t, 1, strings.Count(out, tr.readyLine()), "one ready line:\n%s", out)
	assert.Contains(t, out, "model-api: serving a stand-in Anthropic Messages API on https://"+tr.ports["127.0.0.1:8443"])
}

// checkSecondRun: a second make run beside the first (same config, same stand-in address)
// fails, printing the stand-in's bind failure and naming the listen.* settings in the way.
func checkSecondRun(t *testing.T, tr *tour) {
	// Built already by the first: -o build skips the build step's seconds.
	second := exec.Command("make", "-o", "build", "run", "MODEL_API="+tr.ports["127.0.0.1:8443"])
	second.Dir, second.Env = tr.root, tr.env()
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = second.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = second.Process.Kill()
		<-done
		t.Fatalf("a second make run did not stop by itself:\n%s", out)
	}
	require.Error(t, err, "a second make run fails:\n%s", out)
	assert.Contains(t, string(out), "model-api: cannot listen on "+tr.ports["127.0.0.1:8443"])
	assert.Contains(t, string(out), "make run: the stand-in model API is not running (above)")
	for _, setting := range []string{"mcp", "proxy", "admin"} {
		assert.Regexp(t, regexp.MustCompile(`listen\.`+setting+`: 127\.0\.0\.1:\d+ is in use by another process`), string(out))
	}
	assert.NotContains(t, string(out), "msg=\"ready:", "the second one never says it is ready")
}

// checkInstallRender runs install.md's check of a rendering (helm template, the two seds,
// serve --check-config --offline) as pasted, on the my-values.yaml it shows, with the helm
// `make setup` installs.
func checkInstallRender(t *testing.T, tr *tour) {
	helm := filepath.Join(tr.src, ".tools", "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("helm is not installed (make setup): %v", err)
		}
		t.Skip("helm is not installed (make setup)")
	}
	doc := filepath.Join(tr.root, "docs", "install.md")
	var values, render string
	for _, b := range fencedBlocks(t, doc, "yaml") {
		if strings.HasPrefix(b, "sandboxNamespaces:") {
			values = b
		}
	}
	for _, b := range fencedBlocks(t, doc, "sh") {
		if strings.Contains(b, "helm template sandgate charts/sandgate") && strings.Contains(b, "--check-config") {
			render = b
		}
	}
	require.NotEmpty(t, values, "install.md shows my-values.yaml")
	require.NotEmpty(t, render, "install.md shows how to check a rendering")
	require.NoError(t, os.WriteFile(filepath.Join(tr.root, "my-values.yaml"), []byte(values), 0o644))
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", render)
	cmd.Dir = tr.root
	cmd.Env = append(tr.env(), "PATH="+filepath.Dir(helm)+string(os.PathListSeparator)+plainPath(os.Getenv("PATH")))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "as pasted:\n%s\noutput:\n%s", render, out)
	assert.Contains(t, string(out), "config var/rendered.yaml is valid (offline")
}

// checkCtrlC: Ctrl-C (SIGINT to make run's process group, as a terminal sends it) stops make
// run cleanly: serve stops, and reports no upstream lost or restarted on the way out. (make
// itself dies of the SIGINT, as it does of every Ctrl-C.)
func checkCtrlC(t *testing.T, tr *tour) {
	require.NoError(t, syscall.Kill(-tr.run.Process.Pid, syscall.SIGINT))
	select {
	case <-tr.exited:
	case <-time.After(time.Minute):
		t.Fatalf("make run did not stop within a minute of Ctrl-C:\n%s", tr.log)
	}
	out := tr.log.String()
	assert.Contains(t, out, "sandgate stopped")
	assert.NotContains(t, out, "upstream connection lost")
	assert.NotContains(t, out, "upstream connect failed")
}
