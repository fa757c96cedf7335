package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// TestBothHalvesAnswerAlikeWithTheAuditDown is the parity table's "audit down" row, apart
// because its refusal can write no event: once the audit log is gone (here: removed under a
// running `sandgate serve`), the gateway and the proxy both refuse every call, with the same
// status, the same Retry-After and the same reason, and neither half reaches an upstream.
func TestBothHalvesAnswerAlikeWithTheAuditDown(t *testing.T) {
	cp := startParity(t)
	sid := cp.session(t, cpCoder)
	toolCall := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`
	const haiku = `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
	route := func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, "http://"+cp.proxy+"/routes/anthropic/v1/messages", strings.NewReader(haiku))
		req.Header.Set("Content-Type", "application/json")
		return req
	}
	mcpCall := func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, "http://"+cp.mcp+"/mcp", strings.NewReader(toolCall))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		return req
	}
	require.NoError(t, os.Remove(filepath.Join(cp.auditDir, audit.ActiveFile)))
	// The first call after the removal is the one whose event finds the log gone: its answer is
	// cut (blocking delivery never hands over an unaudited answer), and the writer is unhealthy
	// from then on, so every call after it is refused before anything is answered.
	if code, body, _, err := trySendHeader(cpCoder, route()); err == nil {
		assert.NotEqual(t, http.StatusOK, code, "an answer whose event could not be written: %s", body)
	}

	type answer struct {
		status     int
		body       string
		retryAfter string
	}
	got := map[string]answer{}
	for half, req := range map[string]func() *http.Request{"gateway": mcpCall, "proxy": route} {
		var last error
		ok := assert.Eventually(t, func() bool {
			status, body, h, err := trySendHeader(cpCoder, req())
			got[half], last = answer{status, body, h.Get("Retry-After")}, err
			return err == nil && strings.Contains(body, "audit log unavailable")
		}, 30*time.Second, 10*time.Millisecond, "%s: refused for the audit log", half)
		require.True(t, ok, "%s last answered %+v (error %v)", half, got[half], last)
	}
	gw, px := got["gateway"], got["proxy"]
	assert.Equal(t, http.StatusServiceUnavailable, gw.status, "gateway: %s", gw.body)
	assert.Equal(t, px.status, gw.status, "the same status on both halves")
	assert.Equal(t, px.retryAfter != "", gw.retryAfter != "", "Retry-After on both or neither: gateway %q, proxy %q", gw.retryAfter, px.retryAfter)
	_, err := os.Stat(filepath.Join(cp.auditDir, audit.ActiveFile))
	assert.True(t, os.IsNotExist(err), "no event went to a new log behind the operator's back")
}
