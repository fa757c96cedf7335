package gateway

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// processesOf counts the live processes running the executable bin (zombies excluded: their
// exe link is gone).
func processesOf(t *testing.T, bin string) int {
	t.Helper()
	want, err := filepath.EvalSymlinks(bin)
	require.NoError(t, err)
	exes, err := filepath.Glob("/proc/[0-9]*/exe")
	require.NoError(t, err)
	n := 0
	for _, exe := range exes {
		if got, err := os.Readlink(exe); err == nil && got == want {
			n++
		}
	}
	return n
}

// end ends the sandbox session with DELETE.
func (s *rawSession) end() {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodDelete, s.url, nil)
	require.NoError(s.t, err)
	req.Header.Set("Mcp-Session-Id", s.sid)
	resp, err := s.hc.Do(req)
	require.NoError(s.t, err)
	resp.Body.Close()
}

// TestStdioUpstreamProcessPerSandboxSession: on a stdio upstream in per-sandbox mode every
// sandbox session gets a process of its own, started on its first request, reused for its later
// ones and stopped when the session ends; max_sessions bounds the processes (the least recently
// used idle one is stopped to make room); sessions: shared keeps one process for everyone.
func TestStdioUpstreamProcessPerSandboxSession(t *testing.T) {
	bin := buildExampleUpstream(t)
	echo := map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"}}
	// Pinned to the legacy revision, which has sessions: a 2026-07-28 upstream keeps no session
	// state and shares one connection.
	stdio := func(sessions string, max int) config.Upstream {
		return config.Upstream{Name: "local", Command: bin, Prefix: config.PrefixNever,
			ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION, Sessions: sessions, MaxSessions: max}
	}
	processes := func(t *testing.T, want int, why string) {
		t.Helper()
		require.Eventually(t, func() bool { return processesOf(t, bin) == want }, 10*time.Second, 10*time.Millisecond,
			"%s: want %d processes of the upstream, have %d", why, want, processesOf(t, bin))
	}

	t.Run("per-sandbox", func(t *testing.T) {
		h := startGateway(t, "testdata/policy", stdio(config.SessionsPerSandbox, 8))
		h.waitReady(t)
		processes(t, 1, "the catalog's process only")
		a, b := openRawSession(t, h.URL(), "127.0.0.2"), openRawSession(t, h.URL(), "127.0.0.3")
		a.call("tools/call", echo)
		b.call("tools/call", echo)
		processes(t, 3, "one process per sandbox session")
		a.call("tools/call", echo)
		assert.Equal(t, 3, processesOf(t, bin), "a sandbox session keeps its process")
		a.end()
		processes(t, 2, "ending the sandbox session stops its process")
	})
	t.Run("bounded", func(t *testing.T) {
		h := startGateway(t, "testdata/policy", stdio(config.SessionsPerSandbox, 1))
		h.waitReady(t)
		a, b := openRawSession(t, h.URL(), "127.0.0.2"), openRawSession(t, h.URL(), "127.0.0.1")
		a.call("tools/call", echo)
		processes(t, 2, "the catalog's and a's")
		b.call("tools/call", echo)
		processes(t, 2, "at max_sessions a's idle process makes room for b's")
	})
	t.Run("shared", func(t *testing.T) {
		h := startGateway(t, "testdata/policy", stdio(config.SessionsShared, 0))
		h.waitReady(t)
		openRawSession(t, h.URL(), "127.0.0.2").call("tools/call", echo)
		openRawSession(t, h.URL(), "127.0.0.3").call("tools/call", echo)
		assert.Equal(t, 1, processesOf(t, bin))
	})
}
