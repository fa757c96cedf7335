package kubetest

import (
	"os"
	"path/filepath"
	"testing"
)

// StartController runs the upstream Agent Sandbox controller (core and extensions controllers)
// against c as ControllerUser (a cluster administrator with the name of the controller's
// ServiceAccount, which the chart's identity admission policy lets through), until the test ends. Its webhook, leader election,
// metrics and health endpoints are off: it listens on nothing. Its log is DIR/agent-sandbox.log.
//
// The binary is .tools/bin/agent-sandbox-controller, built by test/setup.sh from the pinned
// release (or named by $SANDGATE_AGENT_SANDBOX_CONTROLLER); missing, the test is skipped unless
// $SANDGATE_REQUIRE_KUBE is set.
func (c *Cluster) StartController(t testing.TB) {
	t.Helper()
	bin := os.Getenv("SANDGATE_AGENT_SANDBOX_CONTROLLER")
	if bin == "" {
		bin = filepath.Join(RepoRoot(), ".tools", "bin", "agent-sandbox-controller")
	}
	if _, err := os.Stat(bin); err != nil {
		missing(t, "%s is missing: run test/setup.sh (it builds the pinned Agent Sandbox controller)", bin)
	}
	start(t, "agent-sandbox", c.Dir, bin,
		"--kubeconfig="+WriteKubeconfig(t, c.Controller),
		"--extensions", "--enable-webhook=false", "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
}
