package gateway

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// TestConformance runs the official MCP conformance suite (@modelcontextprotocol/conformance,
// installed by test/setup.sh), every scenario (--suite all), against everything-server directly
// and then through Sandgate. It runs when SANDGATE_CONFORMANCE=1 (make test sets it). Expected
// failures through Sandgate are listed in testdata/conformance-baseline.yml, each with its
// reason; the suite fails when a listed scenario passes, so the list cannot go stale. Every
// scenario not listed must run as many checks through Sandgate as directly, and pass them.
func TestConformance(t *testing.T) {
	if os.Getenv("SANDGATE_CONFORMANCE") != "1" {
		t.Skip("set SANDGATE_CONFORMANCE=1 (make test does) to run the MCP conformance suite")
	}
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	node := filepath.Join(root, "test/node/node_modules/node/bin/node")
	suite := filepath.Join(root, "test/node/node_modules/@modelcontextprotocol/conformance/dist/index.js")
	everything := filepath.Join(root, ".tools/bin/everything-server")
	for _, p := range []string{node, suite, everything} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing: run test/setup.sh", p)
		}
	}

	addr := freeLoopbackAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	es := exec.CommandContext(ctx, everything, "-http", addr, "-stateless=false")
	require.NoError(t, es.Start())
	t.Cleanup(func() { cancel(); _ = es.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)

	run := func(name, url string, extra ...string) (string, error) {
		args := append([]string{suite, "server", "--suite", "all", "--url", url, "-o", filepath.Join(t.TempDir(), name)}, extra...)
		cmd := exec.CommandContext(ctx, node, args...)
		out, err := cmd.CombinedOutput()
		t.Logf("conformance %s:\n%s", name, summary(string(out)))
		return string(out), err
	}

	directOut, directErr := run("direct", "http://"+addr+"/mcp")
	require.NoError(t, directErr, "everything-server fails the suite directly: update the baseline")

	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: "http://" + addr + "/mcp", Prefix: config.PrefixNever})
	h.waitReady(t)
	var extra []string
	if baseline := "testdata/conformance-baseline.yml"; fileExists(baseline) {
		abs, _ := filepath.Abs(baseline)
		extra = append(extra, "--expected-failures", abs)
	}
	if sc := os.Getenv("SANDGATE_CONFORMANCE_SCENARIO"); sc != "" {
		extra = append(extra, "--scenario", sc)
		out, _ := run("through-sandgate-"+sc, h.URL(), extra...)
		t.Log(out)
	}
	out, err := run("through-sandgate", h.URL(), extra...)
	require.NoError(t, err, "scenarios fail through Sandgate that pass directly")
	direct, through := scenarioCounts(directOut), scenarioCounts(out)
	expected := baselineScenarios(t, "testdata/conformance-baseline.yml")
	for name, want := range direct {
		if !expected[name] {
			require.Equal(t, want, through[name], "scenario %s: checks through Sandgate differ from direct", name)
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

// baselineScenarios is the set of scenarios listed in the expected-failures file.
func baselineScenarios(t *testing.T, p string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	b, err := os.ReadFile(p)
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(l), "- "); ok {
			out[strings.TrimSpace(strings.SplitN(name, "#", 2)[0])] = true
		}
	}
	return out
}

func summary(out string) string {
	if i := strings.Index(out, "=== SUMMARY ==="); i >= 0 {
		return out[i:]
	}
	return out
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
