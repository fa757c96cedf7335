package policy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// replayBase allows every tool but "drop" and denies the rest of the kinds.
const replayBase = `package sandgate

default decision := {"allow": false, "reason": "not a tool call", "code": "not_tool"}

decision := {"allow": true, "reason": "tool allowed", "code": "tool_allowed"} if {
	input.kind == "mcp.tools_call"
	input.mcp.tool != "drop"
}

decision := {"allow": false, "reason": "drop is never allowed", "code": "tool_denied"} if {
	input.kind == "mcp.tools_call"
	input.mcp.tool == "drop"
}
`

// replayCall is decision i of a recorded log: tools cycle through read, write, drop and
// templates through coder and triage.
func replayCall(i int) *policy.Input {
	tools := []string{"read", "write", "drop"}
	templates := []string{"coder", "triage"}
	return &policy.Input{Kind: audit.KindToolsCall,
		Identity: identity.Identity{Namespace: "team-a", Sandbox: "sb-" + strconv.Itoa(i%5), Template: templates[i%2], Known: true},
		MCP:      &policy.MCP{Upstream: "db", Tool: tools[i%3], Arguments: map[string]any{"n": i}}}
}

// recordLog decides n calls under src and writes them to a decision log, as serve does.
func recordLog(t *testing.T, src string, n int, mask []string) string {
	t.Helper()
	e, _ := newEngine(t, map[string]string{"p.rego": src}, policy.WithDecisionCache(0))
	return recordWith(t, e, n, mask, replayCall)
}

func recordWith(t *testing.T, e *policy.Engine, n int, mask []string, call func(int) *policy.Input) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path, Mask: mask, QueueSize: n + 1})
	require.NoError(t, err)
	for i := range n {
		in := call(i)
		l.Record(fmt.Sprintf("id-%06d", i), in, e.Decide(context.Background(), in))
	}
	require.NoError(t, l.Close())
	require.Zero(t, l.Dropped())
	return path
}

// replayEdited is replayBase with one deliberate change: triage sandboxes may no longer write.
const replayEdited = `package sandgate

default decision := {"allow": false, "reason": "not a tool call", "code": "not_tool"}

decision := {"allow": true, "reason": "tool allowed", "code": "tool_allowed"} if {
	input.kind == "mcp.tools_call"
	input.mcp.tool != "drop"
	not triage_write
}

decision := {"allow": false, "reason": "drop is never allowed", "code": "tool_denied"} if {
	input.kind == "mcp.tools_call"
	input.mcp.tool == "drop"
}

decision := {"allow": false, "reason": "triage may not write", "code": "triage_read_only"} if triage_write

triage_write if {
	input.mcp.tool == "write"
	input.identity.template == "triage"
}
`

func TestReplayFindsExactlyTheChangesOfAnEdit(t *testing.T) {
	const n = 600 // i%6 == 1 is a write by a triage sandbox: 100 of them
	path := recordLog(t, replayBase, n, []string{})
	tests := []struct {
		name        string
		edited      string
		allowToDeny int
		changes     []policy.ReplayChange
		examples    []string
	}{
		{"a no-op edit changes nothing", replayBase + "\n# reviewed 2026-12-01\nunused := true\n", 0, []policy.ReplayChange{}, nil},
		{"denying writes to triage changes exactly those", replayEdited, 100,
			[]policy.ReplayChange{{Direction: policy.AllowToDeny, Kind: "mcp.tools_call", Template: "triage",
				FromCode: "tool_allowed", ToCode: "triage_read_only", Count: 100, Targets: []policy.ReplayTarget{{Target: "db/write", Count: 100}}}},
			[]string{"id-000001", "id-000007", "id-000013"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := newEngine(t, map[string]string{"p.rego": tt.edited}, policy.WithDecisionCache(0))
			r, err := policy.Replay(context.Background(), e, path, policy.ReplayOptions{Examples: 3})
			require.NoError(t, err)
			assert.Equal(t, n, r.Read)
			assert.Equal(t, n, r.Replayed)
			assert.Equal(t, tt.allowToDeny, r.AllowToDeny)
			assert.Zero(t, r.DenyToAllow)
			assert.Zero(t, r.CodeChanged)
			assert.Equal(t, n-tt.allowToDeny, r.Unchanged)
			assert.Equal(t, tt.changes, r.Changes)
			assert.Equal(t, tt.allowToDeny > 0, r.Changed())
			var ids []string
			for _, ex := range r.Examples {
				ids = append(ids, ex.DecisionID)
				assert.Equal(t, "db/write", ex.Target)
			}
			assert.Equal(t, tt.examples, ids, "the first changes in the log")
		})
	}
}

func TestReplayFiltersBySandboxAndTime(t *testing.T) {
	path := recordLog(t, replayBase, 50, nil)
	e, _ := newEngine(t, map[string]string{"p.rego": replayBase}, policy.WithDecisionCache(0))
	r, err := policy.Replay(context.Background(), e, path, policy.ReplayOptions{Namespace: "team-a", Sandbox: "sb-0"})
	require.NoError(t, err)
	assert.Equal(t, 10, r.Replayed)
	assert.Equal(t, 40, r.Filtered)
	r, err = policy.Replay(context.Background(), e, path, policy.ReplayOptions{Since: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, 0, r.Replayed)
	r, err = policy.Replay(context.Background(), e, path, policy.ReplayOptions{Template: "triage"})
	require.NoError(t, err)
	assert.Equal(t, 25, r.Replayed)
	assert.Equal(t, 25, r.Filtered)
}

// TestReplayThroughput measures inputs/s on a generated log; SANDGATE_REPLAY_N=100000 sets its size.
func TestReplayThroughput(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SANDGATE_REPLAY_N"))
	if n == 0 {
		t.Skip("set SANDGATE_REPLAY_N to measure replay throughput")
	}
	// The shipped policies, with a mix of allowed and denied tool calls and model requests.
	e, err := policy.New(context.Background(), "../policies", policy.WithDecisionCache(0))
	require.NoError(t, err)
	tools := []string{"get_issue", "list_issues", "create_pull_request", "delete_repo"}
	templates := []string{"coding-agent", "triage-agent"}
	call := func(i int) *policy.Input {
		id := identity.Identity{Namespace: "agents", Sandbox: "sb-" + strconv.Itoa(i%100), Template: templates[i%2], Known: true}
		if i%3 == 0 {
			return &policy.Input{Kind: audit.KindHTTPRequest, Identity: id, HTTP: &policy.HTTP{Method: "POST",
				Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Model: "claude-haiku-4-5", MaxTokens: int64(1000 * (i % 8))}}
		}
		return &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: "github", Tool: tools[i%4],
			Arguments: map[string]any{"owner": "acme", "repo": "r" + strconv.Itoa(i%10), "body": "some text of a pull request"}},
			Grants: map[string]any{"github_repos": []any{"acme/r1", "acme/r2"}}}
	}
	path := recordWith(t, e, n, nil, call)
	r, err := policy.Replay(context.Background(), e, path, policy.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, n, r.Replayed)
	// Under the same policy only decisions that read a masked argument (owner/repo of a
	// grant-scoped tool) can differ.
	require.Equal(t, n, r.Unchanged+r.MaskedChanged)
	t.Logf("replayed %d decisions in %s: %.0f inputs/s", n, r.Elapsed, float64(n)/r.Elapsed.Seconds())
}
