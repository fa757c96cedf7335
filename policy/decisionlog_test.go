package policy_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

func readDecisionLog(t *testing.T, path string) []logs.EventV1 {
	t.Helper()
	files, err := policy.DecisionLogFiles(path)
	require.NoError(t, err)
	var events []logs.EventV1
	for _, name := range files {
		f, err := os.Open(name)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var ev logs.EventV1
			require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "every line decodes as OPA's EventV1")
			events = append(events, ev)
		}
		require.NoError(t, f.Close())
	}
	return events
}

func toolCall(args map[string]any) *policy.Input {
	return &policy.Input{Kind: audit.KindToolsCall,
		Identity: identity.Identity{Namespace: "team-a", Sandbox: "sb-1", Template: "coder", Known: true},
		MCP:      &policy.MCP{Upstream: "github", Tool: "create_issue", Arguments: args}}
}

func TestDecisionLogMasksAndKeepsOPAsFormat(t *testing.T) {
	args := func() map[string]any {
		return map[string]any{"token": "s3cret", "title": "hello", "nested": map[string]any{"password": "pw"}}
	}
	tests := []struct {
		name       string
		mask       []string
		wantArgs   map[string]any
		wantMasked []string
	}{
		{"by default every argument value is masked", nil,
			map[string]any{"token": policy.MaskedValue, "title": policy.MaskedValue, "nested": policy.MaskedValue},
			[]string{"/input/mcp/arguments/*"}},
		{"a configured pointer masks only that argument", []string{"/input/mcp/arguments/token", "/input/mcp/arguments/nested/password"},
			map[string]any{"token": policy.MaskedValue, "title": "hello", "nested": map[string]any{"password": policy.MaskedValue}},
			[]string{"/input/mcp/arguments/token", "/input/mcp/arguments/nested/password"}},
		{"an empty mask list logs arguments in the clear", []string{},
			map[string]any{"token": "s3cret", "title": "hello", "nested": map[string]any{"password": "pw"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "decisions.log")
			l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path, Mask: tt.mask, Labels: map[string]string{"id": "replica-1"}})
			require.NoError(t, err)
			in := toolCall(args())
			l.Record("0190b7a0-0000-7000-8000-000000000001", in,
				policy.Decision{Allow: true, Reason: "ok", Code: "allow", Credential: "gh", Revision: "rev1"})
			require.NoError(t, l.Close())
			assert.Equal(t, "s3cret", in.MCP.Arguments["token"], "masking never changes the caller's input")

			events := readDecisionLog(t, path)
			require.Len(t, events, 1)
			ev := events[0]
			assert.Equal(t, "0190b7a0-0000-7000-8000-000000000001", ev.DecisionID)
			assert.Equal(t, policy.DecisionPath, ev.Path)
			assert.Equal(t, "rev1", ev.Bundles[policy.BundleName].Revision)
			assert.Equal(t, "replica-1", ev.Labels["id"])
			assert.False(t, ev.Timestamp.IsZero())
			assert.Equal(t, tt.wantMasked, ev.Masked)
			input := (*ev.Input).(map[string]any)
			assert.Equal(t, "mcp.tools_call", input["kind"])
			assert.Equal(t, "team-a", input["identity"].(map[string]any)["namespace"])
			assert.Equal(t, tt.wantArgs, input["mcp"].(map[string]any)["arguments"])
			d := policy.DecisionFromResult(ev.Result, "rev1")
			assert.Equal(t, policy.Decision{Allow: true, Reason: "ok", Code: "allow", Credential: "gh", Revision: "rev1"}, d)
		})
	}
}

func TestDecisionLogRotatesAndKeepsMaxFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path, MaxSize: 600, MaxFiles: 2})
	require.NoError(t, err)
	for range 20 {
		l.Record("id", toolCall(nil), policy.Decision{Code: "deny"})
	}
	require.NoError(t, l.Close())
	files, err := policy.DecisionLogFiles(path)
	require.NoError(t, err)
	assert.Len(t, files, 3, "two rotated files and the active one")
	assert.Equal(t, path, files[len(files)-1])
	assert.Zero(t, l.Dropped())
}

func TestDecisionLogDropsWhenTheQueueIsFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path, QueueSize: 1})
	require.NoError(t, err)
	for range 10000 {
		l.Record("id", toolCall(nil), policy.Decision{})
	}
	require.NoError(t, l.Close())
	l.Record("late", toolCall(nil), policy.Decision{})
	assert.Equal(t, uint64(10001), l.Dropped()+l.Written(), "every decision is written or counted as dropped")
	assert.Positive(t, l.Dropped())
	assert.Len(t, readDecisionLog(t, path), int(l.Written()))
}

func TestCheckMaskRefusesWhatIsNotAPointerIntoInputOrResult(t *testing.T) {
	for _, p := range []string{"input/mcp", "/input", "/data/x", "/input/mcp/*/x", "/input/a*"} {
		assert.Error(t, policy.CheckMask(p), p)
	}
	assert.NoError(t, policy.CheckMask("/input/mcp/arguments/a~1b"))
}

// The writer wakes by itself: decisions reach the file while the log stays open, not only at
// Close.
func TestDecisionLogWritesWhileOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	for range 3 {
		l.Record("id", toolCall(nil), policy.Decision{Allow: true})
	}
	require.Eventually(t, func() bool { return len(readDecisionLog(t, path)) == 3 }, 30*time.Second, time.Millisecond)
}
