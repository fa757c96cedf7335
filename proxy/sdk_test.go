package proxy

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// TestAnthropicSDKThroughRoute drives the official TypeScript SDK (test/node) against the
// base-URL route: no CA on the client, a placeholder key, usage recorded in the audit event.
func TestAnthropicSDKThroughRoute(t *testing.T) {
	nodeModules, _ := filepath.Abs("../test/node/node_modules")
	if _, err := os.Stat(filepath.Join(nodeModules, "@anthropic-ai/sdk")); err != nil {
		t.Skip("run test/setup.sh first: @anthropic-ai/sdk is not installed in test/node")
	}
	node := filepath.Join(nodeModules, "node/bin/node")
	if _, err := os.Stat(node); err != nil {
		node = "node"
	}
	h := newHarness(t)
	cmd := exec.Command(node, "testdata/sdk.cjs")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "NODE_PATH=" + nodeModules, "BASE_URL=http://" + h.addr + "/routes/anthropic"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	sandboxReads.Add(t.Name()+" (node)", out)
	require.NoError(t, err, "node: %s", stderr.String())
	var got struct {
		Text               string                                    `json:"text"`
		Usage              struct{ InputTokens, OutputTokens int64 } `json:"usage"`
		StreamText         string                                    `json:"streamText"`
		StreamOutputTokens int64                                     `json:"streamOutputTokens"`
		Denied             string                                    `json:"denied"`
	}
	require.NoError(t, json.Unmarshal(out, &got), string(out))
	assert.Equal(t, "Hello from stand-in", got.Text)
	assert.Equal(t, "Hello streamed", got.StreamText)
	assert.Equal(t, int64(15), got.StreamOutputTokens)
	assert.Equal(t, "403", got.Denied, "sandbox sdk-1 (template beta) may not use sonnet")
	assert.NotContains(t, string(out), realKey)

	keys, _ := h.up.seen()
	require.Len(t, keys, 2)
	assert.Equal(t, []string{realKey, realKey}, keys)
	events := h.rec.all()
	var routed []audit.Event
	for _, e := range events {
		if e.Target.Route == "anthropic" {
			routed = append(routed, e)
		}
	}
	require.Len(t, routed, 3, "exactly one audit event per request")
	assert.Equal(t, [2]int64{12, 34}, [2]int64{routed[0].Outcome.TokensIn, routed[0].Outcome.TokensOut})
	assert.Equal(t, [2]int64{25, 15}, [2]int64{routed[1].Outcome.TokensIn, routed[1].Outcome.TokensOut})
	assert.Equal(t, "claude-haiku-4-5", routed[1].Target.Model)
	assert.Equal(t, "/v1/messages", routed[1].Target.Path)
	assert.Equal(t, "anthropic", routed[1].Credential)
	assert.False(t, routed[2].Decision.Allow)
	assert.Equal(t, 403, routed[2].Outcome.Status)
}
