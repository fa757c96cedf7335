package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
)

// cancelled is signalled when the stand-in's /cancel stream saw its request cancelled.
var cancelled = make(chan struct{}, 1)

func init() {
	// /cancel/v1/messages streams the start of an answer and then waits, as a model thinking,
	// until its request is cancelled: it never ends the stream itself.
	standInPaths["/cancel/v1/messages"] = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_c\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-haiku-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n"+
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Once upon\"}}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-time.After(30 * time.Second):
		}
	}
}

// TestCancelledStreamIsAuditedAsSuch (issue 59, class 10): the Anthropic SDK cancels a streamed
// message after its first text. The sandbox got 200 and part of the answer; the upstream
// request is cancelled, and the call's one event says the client went away (client_closed)
// beside the status it got, with the tokens the stream had reported.
func TestCancelledStreamIsAuditedAsSuch(t *testing.T) {
	nodeModules, _ := filepath.Abs("../test/node/node_modules")
	if _, err := os.Stat(filepath.Join(nodeModules, "@anthropic-ai/sdk")); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatal("@anthropic-ai/sdk is not installed in test/node: run test/setup.sh")
		}
		t.Skip("run test/setup.sh first: @anthropic-ai/sdk is not installed in test/node")
	}
	node := filepath.Join(nodeModules, "node/bin/node")
	if _, err := os.Stat(node); err != nil {
		node = "node"
	}
	h := newHarness(t)
	cmd := exec.Command(node, "testdata/sdk_cancel.cjs")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "NODE_PATH=" + nodeModules, "BASE_URL=http://" + h.addr + "/routes/anthropic/cancel"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	sandboxReads.Add(t.Name()+" (node)", out)
	require.NoError(t, err, "node: %s", stderr.String())
	var got struct {
		Text    string `json:"text"`
		Aborted bool   `json:"aborted"`
	}
	require.NoError(t, json.Unmarshal(out, &got), string(out))
	assert.Equal(t, "Once upon", got.Text)
	assert.True(t, got.Aborted, "the SDK aborted its request")
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == "/cancel/v1/messages" })
	assert.Equal(t, call.CodeClientClosed, ev.Outcome.Error)
	assert.Equal(t, http.StatusOK, ev.Outcome.Status, "the status the sandbox got")
	assert.True(t, ev.Decision.Allow)
	assert.Equal(t, int64(25), ev.Outcome.TokensIn, "usage the stream reported before the end")
	assert.Positive(t, ev.Outcome.BytesOut)
	n := 0
	for _, e := range h.rec.all() {
		if e.Target.Path == "/cancel/v1/messages" {
			n++
		}
	}
	assert.Equal(t, 1, n, "one event")
}
