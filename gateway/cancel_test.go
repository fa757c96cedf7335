package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// TestCancellationReachesTheUpstream: a sandbox that cancels a call (notifications/cancelled
// naming its own request ID) makes Sandgate cancel the upstream request, naming the upstream's
// request ID, which the sandbox never sees.
func TestCancellationReachesTheUpstream(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")

	s.id++
	callID := s.id
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp := s.post(map[string]any{"jsonrpc": "2.0", "id": callID, "method": "tools/call",
			"params": map[string]any{"name": "slow", "arguments": map[string]any{}}})
		resp.Body.Close()
	}()
	require.Eventually(t, func() bool { return len(up.received("tools/call")) == 1 }, 5*time.Second, 10*time.Millisecond)
	s.post(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled",
		"params": map[string]any{"requestId": callID, "reason": "user pressed stop"}}).Body.Close()

	require.Eventually(t, func() bool { return len(up.received("notifications/cancelled")) == 1 }, 5*time.Second, 10*time.Millisecond,
		"the upstream is told")
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	require.NoError(t, json.Unmarshal(up.received("notifications/cancelled")[0].Params, &p))
	assert.JSONEq(t, string(up.received("tools/call")[0].ID), string(p.RequestID), "naming the upstream's request ID")
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled call still holds the sandbox's request")
	}
}

// TestUpstreamStreamEndedForPollingIsResumed: an upstream that ends a call's stream before the
// result, having sent an event ID (SEP-1699 polling), is resumed with Last-Event-ID, and the
// sandbox gets the result.
func TestUpstreamStreamEndedForPollingIsResumed(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	res := s.call("tools/call", map[string]any{"name": "poll", "arguments": map[string]any{}})
	assert.Contains(t, string(res), "resumed")
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Equal(t, []string{"ev-1"}, up.resumes)
}
