package layout

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// makeGOFLAGS reports the GOFLAGS make gives target's recipes: a probe target, made a
// prerequisite of target, inherits target's target-specific variables; -n prints its echo
// instead of running anything.
func makeGOFLAGS(t *testing.T, root, target string) string {
	t.Helper()
	cmd := exec.Command("make", "-n", "-s", "--no-print-directory", "-C", root,
		"--eval", "sg-probe-goflags: ; @echo GOFLAGS=$(GOFLAGS)", "--eval", target+": sg-probe-goflags", target)
	// The GOFLAGS of this test's own environment (make test's) would be the answer for any target.
	cmd.Env = append(os.Environ(), "GOFLAGS=", "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.Output()
	require.NoError(t, err, "make -n %s", target)
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "echo GOFLAGS="); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("make -n %s: the probe printed nothing:\n%s", target, out)
	return ""
}

// Every go command of make test compiles a package with the same flags, or a cold run compiles
// it twice (the flags are part of the build cache's key): the test, vet, lint and setup targets
// run with the Makefile's TEST_GOFLAGS; `make build` (the image's binary) with none of them.
func TestMakeTestCompilesAlikeAndBuildKeepsTheDefaults(t *testing.T) {
	root := repoRoot(t)
	want := makeGOFLAGS(t, root, "print-test-goflags")
	require.Contains(t, want, "-gcflags=", "print-test-goflags")
	for _, target := range []string{"setup", "test", "test-unit", "test-race", "test-policy", "lint"} {
		assert.Equal(t, want, makeGOFLAGS(t, root, target), "GOFLAGS of make %s", target)
	}
	assert.Empty(t, makeGOFLAGS(t, root, "build"), "GOFLAGS of make build")

	// test/setup.sh's builds keep make's GOFLAGS (only go_tool's, from their own modules, drop it).
	setup, err := os.ReadFile(filepath.Join(root, "test", "setup.sh"))
	require.NoError(t, err)
	for _, line := range regexp.MustCompile(`(?m)^.*GOFLAGS=.*go build.*$`).FindAllString(string(setup), -1) {
		assert.Contains(t, line, "$GOFLAGS", "test/setup.sh replaces make's GOFLAGS for a build: %s", line)
	}
}

// What TEST_GOFLAGS means to the go command: packages from other modules compile with -N -l,
// the standard library and Sandgate's own packages with the default flags; binaries link
// without DWARF.
func TestTestGOFLAGSLeaveStdAndSandgateOptimized(t *testing.T) {
	root := repoRoot(t)
	cmd := exec.Command("go", "build", "-a", "-n", "./cmd/sandgate")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS="+makeGOFLAGS(t, root, "print-test-goflags"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build -a -n: %s", out)
	assert.Regexp(t, `(?m)/link -o .* -w `, string(out), "the link keeps DWARF")
	unoptimized := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\S*compile -o .* -p (\S+) (.*)$`).FindAllStringSubmatch(string(out), -1) {
		unoptimized[m[1]] = strings.Contains(m[2], " -N -l")
	}
	for pkg, want := range map[string]bool{
		"net/http": false, "runtime": false,
		"github.com/sandgate/sandgate/policy": false, "github.com/sandgate/sandgate/proxy": false,
		"github.com/open-policy-agent/opa/v1/ast": true, "github.com/redis/go-redis/v9": true,
	} {
		got, ok := unoptimized[pkg]
		if assert.True(t, ok, "go build -n compiles no %s", pkg) {
			assert.Equal(t, want, got, "%s compiled with -N -l", pkg)
		}
	}
}
