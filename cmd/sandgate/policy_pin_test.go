package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/pins"
	"github.com/sandgate/sandgate/policy"
)

// buildExampleUpstream builds examples/mcp-upstream (the example's stdio upstream).
func buildExampleUpstream(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mcp-upstream")
	out, err := exec.Command("go", "build", "-o", bin, "../../examples/mcp-upstream").CombinedOutput()
	require.NoError(t, err, "go build examples/mcp-upstream: %s", out)
	return bin
}

// copyPolicies copies the shipped policy folder (tests included) into a temporary folder.
func copyPolicies(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(repoPath(t, "policies") + "/*")
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	return dir
}

func TestPolicyPinWritesThePinsAndDiffShowsWhatChanged(t *testing.T) {
	bin := buildExampleUpstream(t)
	dir := copyPolicies(t)
	cfg := func(args string) string {
		return writeFile(t, t.TempDir(), "sandgate.yaml", "policy: {dir: "+dir+"}\ngateway:\n  upstreams:\n    - {name: everything, command: "+bin+", args: ["+args+"]}\n")
	}
	code, out, errOut := runCLI(t, nil, "policy", "pin", "--config", cfg(""))
	require.Equal(t, 0, code, "%s%s", out, errOut)
	assert.Contains(t, out, "pinned 4 tools of 1 upstream in "+filepath.Join(dir, pins.FileName))
	f, err := pins.Load(dir)
	require.NoError(t, err)
	assert.Len(t, f.Tools["everything"], 4)
	assert.Equal(t, "Returns its message", f.Tools["everything"]["echo"].Description)

	code, out, _ = runCLI(t, nil, "policy", "pin", "--config", cfg(""), "--diff")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "the live tool definitions are the pinned ones")

	// The upstream now lists other tools: --diff says which, exits 1, and writes nothing.
	before, err := os.ReadFile(filepath.Join(dir, pins.FileName))
	require.NoError(t, err)
	code, out, errOut = runCLI(t, nil, "policy", "pin", "--config", cfg(`"-tool-prefix", "x-"`), "--diff")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "8 tool definitions differ from the pins")
	assert.Contains(t, out, "unpinned  everything/x-echo")
	assert.Contains(t, out, "removed   everything/echo")
	after, err := os.ReadFile(filepath.Join(dir, pins.FileName))
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after), "--diff writes nothing")

	// The pins file is policy data: the folder loads, its tests pass, its revision names it.
	eng, err := policy.New(context.Background(), dir)
	require.NoError(t, err)
	code, out, _ = runCLI(t, nil, "policy", "test", dir)
	assert.Equal(t, 0, code, out)
	code, _, _ = runCLI(t, nil, "policy", "pin", "--config", cfg(`"-tool-prefix", "x-"`))
	require.Equal(t, 0, code)
	require.NoError(t, eng.Reload(context.Background()))
	code, out, _ = runCLI(t, nil, "policy", "eval", "--dir", dir, "--input", repoPath(t, "examples/inputs/tools_call-allowed.json"))
	assert.Equal(t, 0, code)
	assert.Contains(t, out, eng.Revision())

	code, _, errOut = runCLI(t, nil, "policy", "pin", "--config", cfg(""), "--upstream", "nope")
	assert.Equal(t, 2, code)
	assert.True(t, strings.Contains(errOut, `no upstream "nope"`), errOut)
}
