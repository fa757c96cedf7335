package kubetest

import (
	"os"
	"testing"
)

// StartController runs the upstream Agent Sandbox controller of c.Release (core and extensions
// controllers) against c as ControllerUser (a cluster administrator with the name of the
// controller's ServiceAccount, which the chart's identity admission policy lets through), until
// the test ends or the returned function stops it (a restart is StartController again). Its
// webhook, leader election, metrics and health endpoints are off: it listens on nothing. Its log
// is DIR/agent-sandbox.log, every run appended.
//
// The binary is built by test/setup.sh from the pinned release (Release.Controller); missing,
// the test is skipped unless $SANDGATE_REQUIRE_KUBE is set.
func (c *Cluster) StartController(t testing.TB) (stop func()) {
	t.Helper()
	bin := c.Release.Controller()
	if _, err := os.Stat(bin); err != nil {
		missing(t, "%s is missing: run test/setup.sh (it builds the pinned Agent Sandbox %s controller)", bin, c.Release.Version)
	}
	args := append([]string{"--kubeconfig=" + WriteKubeconfig(t, c.Controller),
		"--extensions", "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0"}, c.Release.flags...)
	return start(t, "agent-sandbox", c.Dir, bin, args...)
}
