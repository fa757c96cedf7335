package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCtrlCStopsWithoutRestartingAStdioUpstream: Ctrl-C at a terminal signals the whole
// foreground process group, as it does under `make run`. The stdio upstream sandgate started
// is in a process group of its own, so it is not signalled with sandgate: sandgate stops it
// itself, and never logs it lost ("upstream connection lost; reconnecting") or starts a new
// one during its shutdown. Before, the upstream died of the same Ctrl-C, the health ping found
// it gone within the 5 s shutdown delay, and a second server was started while stopping.
func TestCtrlCStopsWithoutRestartingAStdioUpstream(t *testing.T) {
	dir := t.TempDir()
	upstreamBin := filepath.Join(dir, "mcp-upstream")
	build := exec.Command("go", "build", "-o", upstreamBin, "github.com/sandgate/sandgate/examples/mcp-upstream")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	// The upstream's command records each start (its process id) and becomes the server.
	starts := filepath.Join(dir, "starts")
	wrapper := filepath.Join(dir, "upstream.sh")
	require.NoError(t, os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\necho $$ >> %q\nexec %q\n", starts, upstreamBin)), 0o755))

	// make run's shutdown delay (the default 5 s): long enough for the ping (every 2 s) to find
	// a dead upstream.
	g := newGate(t, fmt.Sprintf("{dir: %q}", mustAbs(t, "../../policies")),
		fmt.Sprintf("shutdown: {delay: 5s, drain: 1s}\ngateway:\n  upstreams:\n    - {name: everything, command: %q, prefix: never}\n", wrapper))
	logFile, err := os.Create(g.logTo)
	require.NoError(t, err)
	defer logFile.Close()
	cmd := exec.Command(sandgateBin, "serve", "--config", g.cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground job
	require.NoError(t, cmd.Start())
	g.cmd, g.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		g.exitCode = cmd.ProcessState.ExitCode()
		close(g.exited)
	}()
	ready := `msg="ready: MCP at http://` + g.mcp + `/mcp, proxy at ` + g.proxy + `, admin at http://` + g.admin + `"`
	g.eventually("sandgate says it is ready, in one line", func() bool {
		log, err := os.ReadFile(g.logTo)
		return err == nil && strings.Contains(string(log), ready)
	})
	code, body := g.readyz()
	require.Equal(t, 200, code, "the ready line comes once /readyz answers 200: %v", body)
	require.NotContains(t, fmt.Sprint(body["degraded"]), "upstream", "ready with the stdio upstream connected")
	pids := startedPIDs(t, starts)
	require.Len(t, pids, 1)
	assert.NotEqual(t, processGroup(t, cmd.Process.Pid), processGroup(t, pids[0]),
		"the stdio upstream runs in a process group of its own")

	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)) // Ctrl-C
	select {
	case <-g.exited:
	case <-time.After(wait):
		t.Fatalf("sandgate did not stop within %s of Ctrl-C", wait)
	}
	assert.Equal(t, 0, g.exitCode)
	log, err := os.ReadFile(g.logTo)
	require.NoError(t, err)
	assert.NotContains(t, string(log), "upstream connection lost")
	assert.NotContains(t, string(log), "upstream connect failed")
	assert.Len(t, startedPIDs(t, starts), 1, "no stdio upstream is started during the shutdown:\n%s", log)
	assert.Equal(t, 1, strings.Count(string(log), ready), "one ready line:\n%s", log)
}

func startedPIDs(t *testing.T, file string) []int {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	return pids
}

// processGroup reads a process's group from /proc/PID/stat (field 5, after the name in
// parentheses).
func processGroup(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	pgid, err := strconv.Atoi(fields[2])
	require.NoError(t, err)
	return pgid
}
