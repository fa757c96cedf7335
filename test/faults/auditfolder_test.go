package faults

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// shippedPolicies is the policy section of every gate of these tests.
func shippedPolicies(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../policies")
	require.NoError(t, err)
	return fmt.Sprintf("{dir: %q}", p)
}

// waitExit waits until the gate's process has exited, for at most wait.
func (g *gate) waitExit() {
	g.t.Helper()
	select {
	case <-g.exited:
	case <-time.After(wait):
		g.t.Fatalf("sandgate did not exit within %s", wait)
	}
}

// restartReady starts the gate's process again and waits until /readyz says ready.
func (g *gate) restartReady() {
	g.t.Helper()
	g.start()
	g.eventually("sandgate ready", func() bool { code, _ := g.readyz(); return code == http.StatusOK })
}

// kill sends SIGKILL and waits for the process to be gone.
func (g *gate) kill() {
	g.t.Helper()
	require.NoError(g.t, g.cmd.Process.Signal(syscall.SIGKILL))
	g.waitExit()
}

// auditVerify runs the binary's `audit verify --dir`.
func auditVerify(t *testing.T, dir string) (int, string) {
	t.Helper()
	out, err := exec.Command(sandgateBin, "audit", "verify", "--dir", dir).CombinedOutput()
	var exit *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &exit)
		return exit.ExitCode(), string(out)
	}
	return 0, string(out)
}

// TestOneAuditFolderHasOneWriter: a second sandgate (another replica, a second `make run`)
// pointed at the audit folder of a running one refuses to start, never ready, and says which
// folder and which process holds it; the first goes on serving. A holder killed at any moment
// (idle, answering calls, still starting) leaves the folder to the next one at once, and the
// log they wrote in turn is one chain.
func TestOneAuditFolderHasOneWriter(t *testing.T) {
	a := startGate(t, "")
	a.connect(coder1)

	second := newGateIn(t, shippedPolicies(t), "", a.auditDir)
	second.start()
	second.waitExit()
	assert.NotEqual(t, 0, second.exitCode, "the second process fails to start")
	logText, err := os.ReadFile(second.logTo)
	require.NoError(t, err)
	assert.Contains(t, string(logText), "audit folder "+a.auditDir+" is already taken")
	assert.Contains(t, string(logText), fmt.Sprintf("pid %d on host", a.cmd.Process.Pid), "the refusal names the holder")
	assert.NotContains(t, string(logText), "sandgate starting", "it never opened its listeners")
	code, _ := second.readyz()
	assert.Equal(t, 0, code, "it never answered /readyz")
	a.connect(coder2) // the holder serves on

	holder, next := a, second
	for _, moment := range []string{"idle", "answering calls", "starting"} {
		switch moment {
		case "answering calls":
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, src := range []string{coder1, coder2} {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
							_, _ = holder.tryConnect(src)
						}
					}
				})
			}
			holder.eventually("calls under way", func() bool { return holder.answered.Load() > 20 })
			holder.kill()
			close(stop)
			wg.Wait()
		case "starting":
			holder.kill()
			holder.start() // killed again before it is ready, the folder maybe taken already
			holder.kill()
		default:
			holder.kill()
		}
		next.restartReady()
		next.connect(coder1)
		holder, next = next, holder
	}
	require.Equal(t, 0, holder.terminate())
	code, out := auditVerify(t, a.auditDir)
	assert.Equal(t, 0, code, "one chain, written in turn: %s", out)
	assert.NotContains(t, out, "two writers")
}

// TestAForkedAuditLogIsNamedAndNotContinued: two processes that each continued one log (here:
// the folder copied, so both start from the same last line, as two replicas on one folder did
// before the lock) leave two chains; interleaved into one file as such processes write it,
// `audit verify` says "two writers" rather than "edited", and a sandgate started on it
// refuses to carry the fork on.
func TestAForkedAuditLogIsNamedAndNotContinued(t *testing.T) {
	a := startGate(t, "")
	a.connect(coder1)
	require.Equal(t, 0, a.terminate())
	copyDir := filepath.Join(t.TempDir(), "audit")
	require.NoError(t, os.MkdirAll(copyDir, 0o700))
	common, err := os.ReadFile(filepath.Join(a.auditDir, audit.ActiveFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(copyDir, audit.ActiveFile), common, 0o600))

	a.restartReady()
	b := newGateIn(t, shippedPolicies(t), "", copyDir)
	b.restartReady()
	for range 3 {
		a.connect(coder1)
		b.connect(coder2)
	}
	require.Equal(t, 0, a.terminate())
	require.Equal(t, 0, b.terminate())

	interleave(t, filepath.Join(a.auditDir, audit.ActiveFile), len(common), filepath.Join(copyDir, audit.ActiveFile))
	code, out := auditVerify(t, a.auditDir)
	assert.Equal(t, 3, code, out)
	assert.Contains(t, out, "two writers")
	assert.NotContains(t, out, "edited")

	a.start()
	a.waitExit()
	assert.NotEqual(t, 0, a.exitCode, "a restart does not continue the forked log")
	assert.NotEmpty(t, a.logLines("written by two processes at once"))
}

// interleave merges the lines other added after the first n bytes into path's lines after
// them, each file's in its own order and the two by event time, as two processes appending to
// one file would have left them.
func interleave(t *testing.T, path string, n int, other string) {
	t.Helper()
	mine, err := os.ReadFile(path)
	require.NoError(t, err)
	theirs, err := os.ReadFile(other)
	require.NoError(t, err)
	require.True(t, bytes.Equal(mine[:n], theirs[:n]), "both continued one log")
	split := func(b []byte) []string { return strings.Split(strings.TrimSuffix(string(b[n:]), "\n"), "\n") }
	at := func(l string) time.Time {
		ev, err := audit.ParseLine([]byte(l))
		require.NoError(t, err)
		return ev.Time
	}
	a, b := split(mine), split(theirs)
	out := append([]byte{}, mine[:n]...)
	for len(a) > 0 || len(b) > 0 {
		if len(b) == 0 || len(a) > 0 && !at(b[0]).Before(at(a[0])) {
			out, a = append(append(out, a[0]...), '\n'), a[1:]
		} else {
			out, b = append(append(out, b[0]...), '\n'), b[1:]
		}
	}
	require.NoError(t, os.WriteFile(path, out, 0o600))
}
