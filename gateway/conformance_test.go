package gateway

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/internal/config"
)

// TestConformance runs the official MCP conformance suite (@modelcontextprotocol/conformance,
// installed by test/setup.sh), every scenario (--suite all), against two implementations of an
// MCP server, each directly and then through Sandgate: the Go SDK's conformance
// everything-server and the TypeScript SDK's reference server
// (@modelcontextprotocol/server-everything), the latter also over stdio through Sandgate. It
// runs when SANDGATE_CONFORMANCE=1 (make test sets it).
//
// Each upstream has a baseline file in testdata listing, with reasons, the scenarios it fails
// directly and the few whose result through Sandgate differs from direct (the gateway's own
// endpoint checks, its answer to a tool outside the catalog). Every other scenario must run as
// many checks through Sandgate as directly, with the same passes and failures; the suite fails
// when a listed failure passes, so the lists cannot go stale.
func TestConformance(t *testing.T) {
	if os.Getenv("SANDGATE_CONFORMANCE") != "1" {
		t.Skip("set SANDGATE_CONFORMANCE=1 (make test does) to run the MCP conformance suite")
	}
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	cf := conformance{
		node:  filepath.Join(root, "test/node/node_modules/node/bin/node"),
		suite: filepath.Join(root, "test/node/node_modules/@modelcontextprotocol/conformance/dist/index.js"),
	}
	goServer := filepath.Join(root, ".tools/bin/everything-server")
	tsServer := filepath.Join(root, "test/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	loopbackOnly := filepath.Join(root, "test/node/loopback-only.mjs")
	for _, p := range []string{cf.node, cf.suite, goServer, tsServer, loopbackOnly} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing: run test/setup.sh", p)
		}
	}
	t.Run("go-sdk", func(t *testing.T) {
		addr := freeLoopbackAddr(t)
		startReferenceServer(t, addr, exec.Command(goServer, "-http", addr, "-stateless=false"))
		cf.compare(t, "testdata/conformance-baseline.yml", "http://"+addr+"/mcp",
			config.Upstream{Name: "everything", URL: "http://" + addr + "/mcp", Prefix: config.PrefixNever})
	})
	// The TypeScript server takes no listen address; loopback-only.mjs binds it to 127.0.0.1.
	tsArgs := []string{"--import", loopbackOnly, tsServer}
	startTS := func(t *testing.T) string {
		addr := freeLoopbackAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(cf.node, slices.Concat(tsArgs, []string{"streamableHttp"})...)
		cmd.Env = append(os.Environ(), "PORT="+port)
		startReferenceServer(t, addr, cmd)
		return "http://" + addr + "/mcp"
	}
	t.Run("typescript-sdk", func(t *testing.T) {
		url := startTS(t)
		cf.compare(t, "testdata/conformance-typescript.yml", url,
			config.Upstream{Name: "everything", URL: url, Prefix: config.PrefixNever})
	})
	t.Run("typescript-sdk-stdio", func(t *testing.T) {
		// Compared with the same server over Streamable HTTP directly: the suite speaks HTTP.
		cf.compare(t, "testdata/conformance-typescript.yml", startTS(t),
			config.Upstream{Name: "everything", Command: cf.node, Args: slices.Concat(tsArgs, []string{"stdio"}), Prefix: config.PrefixNever,
				MaxSessions: 8})
	})
}

// conformanceBaseline is an expected-failures file of the suite (its server key) with one more
// key the suite ignores: through-sandgate, the scenarios whose result through Sandgate is
// expected to differ from direct ("passes" or "fails"), each with its reason in a comment.
type conformanceBaseline struct {
	Direct  []string            `json:"server"`
	Through []map[string]string `json:"through-sandgate"`
}

// through is the expected-failures list through Sandgate and the scenarios whose result there
// is expected to differ, with that result.
func (b conformanceBaseline) through() ([]string, map[string]string) {
	differ := map[string]string{}
	for _, m := range b.Through {
		for name, result := range m {
			differ[name] = result
		}
	}
	var fails []string
	for _, name := range b.Direct {
		if differ[name] != "passes" {
			fails = append(fails, name)
		}
	}
	for name, result := range differ {
		if result == "fails" {
			fails = append(fails, name)
		}
	}
	return fails, differ
}

// conformance is the installed suite.
type conformance struct{ node, suite string }

// run runs the suite against url with the scenarios in expected expected to fail.
func (c conformance) run(t *testing.T, name, url string, expected []string) (string, error) {
	dir := filepath.Join(t.TempDir(), name)
	b, err := yaml.Marshal(map[string][]string{"server": append([]string{}, expected...)})
	require.NoError(t, err)
	file := dir + ".expected-failures.yml"
	require.NoError(t, os.WriteFile(file, b, 0o600))
	args := []string{c.suite, "server", "--suite", "all", "--url", url, "-o", dir, "--expected-failures", file}
	if sc := os.Getenv("SANDGATE_CONFORMANCE_SCENARIO"); sc != "" {
		args = append(args, "--scenario", sc)
	}
	out, err := exec.CommandContext(t.Context(), c.node, args...).CombinedOutput()
	t.Logf("conformance %s:\n%s%s", name, summary(string(out)), failedChecks(dir))
	return string(out), err
}

// failedChecks is what the checks that failed in the suite's output folder dir said.
func failedChecks(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*", "checks.json"))
	var out strings.Builder
	for _, f := range files {
		b, _ := os.ReadFile(f)
		var checks []struct {
			Status, ErrorMessage string
		}
		_ = json.Unmarshal(b, &checks)
		for _, c := range checks {
			if c.Status == "FAILURE" {
				fmt.Fprintf(&out, "  %s: %s\n", filepath.Base(filepath.Dir(f)), c.ErrorMessage)
			}
		}
	}
	return out.String()
}

// compare runs the suite directly against url and through Sandgate in front of up, and
// requires the same checks to pass and fail per scenario, except the differences the baseline
// file lists.
func (c conformance) compare(t *testing.T, baselineFile, url string, up config.Upstream) {
	var base conformanceBaseline
	b, err := os.ReadFile(baselineFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &base), baselineFile)
	directOut, err := c.run(t, "direct", url, base.Direct)
	require.NoError(t, err, "the upstream's results directly differ from %s", baselineFile)

	h := startGateway(t, "testdata/policy", up)
	h.waitReady(t)
	fails, differ := base.through()
	out, err := c.run(t, "through-sandgate", h.URL(), fails)
	require.NoError(t, err, "the results through Sandgate differ from %s", baselineFile)

	direct, via := scenarioCounts(directOut), scenarioCounts(out)
	require.NotEmpty(t, direct)
	for name, want := range direct {
		switch differ[name] {
		case "passes":
			assert.True(t, strings.HasSuffix(via[name], " 0 failed"), "scenario %s through Sandgate: %s", name, via[name])
		case "fails":
		default:
			assert.Equal(t, want, via[name], "scenario %s: checks through Sandgate differ from direct", name)
		}
	}
}

// scenarioCounts reads "✓ name: N passed, M failed" lines of the suite's summary.
func scenarioCounts(out string) map[string]string {
	counts := map[string]string{}
	for _, l := range strings.Split(summary(out), "\n") {
		l = strings.TrimSpace(l)
		l = strings.TrimPrefix(strings.TrimPrefix(l, "✓ "), "✗ ")
		if name, c, ok := strings.Cut(l, ": "); ok && strings.HasSuffix(c, " failed") && !strings.Contains(name, " ") && name != "Total" {
			counts[name] = c
		}
	}
	return counts
}

func summary(out string) string {
	if i := strings.Index(out, "=== SUMMARY ==="); i >= 0 {
		return out[i:]
	}
	return out
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
