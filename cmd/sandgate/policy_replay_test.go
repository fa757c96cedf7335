package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

const replayPolicy = `package sandgate

default decision := {"allow": false, "reason": "not allowed", "code": "not_allowed"}

decision := {"allow": true, "reason": "read is fine", "code": "read_ok"} if input.mcp.tool in {"read", "write"}
`

// replayPolicyEdited stops allowing write.
const replayPolicyEdited = `package sandgate

default decision := {"allow": false, "reason": "not allowed", "code": "not_allowed"}

decision := {"allow": true, "reason": "read is fine", "code": "read_ok"} if {
	trace("read only since the edit")
	input.mcp.tool == "read"
}
`

// recordDecisions writes a decision log of three calls (read, write, drop) under replayPolicy,
// as serve does, and returns its path and the decision ids.
func recordDecisions(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	writePolicyFile(t, filepath.Join(dir, "p", "p.rego"), replayPolicy)
	e, err := policy.New(context.Background(), filepath.Join(dir, "p"))
	require.NoError(t, err)
	path := filepath.Join(dir, "log", "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path})
	require.NoError(t, err)
	var ids []string
	for _, tool := range []string{"read", "write", "drop"} {
		var ev audit.Event
		id := ev.AssignID()
		in := &policy.Input{Kind: audit.KindToolsCall, Identity: identity.Identity{Namespace: "ns", Sandbox: "sb", Template: "coder", Known: true},
			MCP: &policy.MCP{Upstream: "db", Tool: tool}}
		l.Record(id, in, e.Decide(context.Background(), in))
		ids = append(ids, id)
	}
	require.NoError(t, l.Close())
	return path, ids
}

func writePolicyFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

func TestPolicyReplayReportsChangesAndExitCodes(t *testing.T) {
	logPath, ids := recordDecisions(t)
	dir := t.TempDir()
	writePolicyFile(t, filepath.Join(dir, "same", "p.rego"), replayPolicy+"\n# a comment\n")
	writePolicyFile(t, filepath.Join(dir, "edited", "p.rego"), replayPolicyEdited)

	code, out, errOut := runCLI(t, nil, "policy", "replay", "--policies", filepath.Join(dir, "same"), "--from", logPath, "--fail-on-change")
	assert.Equal(t, 0, code, "a no-op edit changes nothing: %s%s", out, errOut)
	assert.Contains(t, out, "unchanged 3, allow→deny 0, deny→allow 0")

	code, out, errOut = runCLI(t, nil, "policy", "replay", "--policies", filepath.Join(dir, "edited"), "--from", logPath, "--fail-on-change")
	assert.Equal(t, 1, code, "--fail-on-change exits 1 when a decision changes: %s", errOut)
	assert.Contains(t, errOut, "1 decision would change\n")
	assert.Contains(t, out, "allow→deny 1")
	assert.Contains(t, out, ids[1], "the example names the changed decision")
	assert.Contains(t, out, "read_ok → not_allowed")

	code, out, _ = runCLI(t, nil, "policy", "replay", "--policies", filepath.Join(dir, "edited"), "--from", logPath, "-o", "json", "--sandbox", "ns/sb")
	require.Equal(t, 0, code, "without --fail-on-change a change is not a failure")
	var r policy.ReplayReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	assert.Equal(t, 1, r.AllowToDeny)
	require.Len(t, r.Examples, 1)
	assert.Equal(t, ids[1], r.Examples[0].DecisionID)

	code, _, _ = runCLI(t, nil, "policy", "replay", "--policies", filepath.Join(dir, "edited"), "--from", logPath, "--sandbox", "nope")
	assert.Equal(t, 2, code)
}

func TestPolicyEvalReRunsOneLoggedDecision(t *testing.T) {
	logPath, ids := recordDecisions(t)
	dir := filepath.Join(t.TempDir(), "edited")
	writePolicyFile(t, filepath.Join(dir, "p.rego"), replayPolicyEdited)

	code, out, errOut := runCLI(t, nil, "policy", "eval", "--decision-id", ids[1], "--from", logPath, "--dir", dir)
	require.Equal(t, 0, code, errOut)
	var got struct {
		DecisionID string `json:"decision_id"`
		Logged     struct{ Allow bool }
		Replayed   struct{ Allow bool }
		Changed    bool
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, ids[1], got.DecisionID)
	assert.True(t, got.Logged.Allow)
	assert.False(t, got.Replayed.Allow)
	assert.True(t, got.Changed)

	code, out, errOut = runCLI(t, nil, "policy", "eval", "--decision-id", ids[0], "--from", logPath, "--dir", dir, "--explain=notes")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "explanation (notes)")
	assert.Contains(t, out, "read only since the edit", "OPA's notes trace")

	code, _, _ = runCLI(t, nil, "policy", "eval", "--decision-id", "no-such-id", "--from", logPath, "--dir", dir)
	assert.Equal(t, 1, code)
}

// --from names an audit log (its folder, or its file): its calls are decided under --baseline
// and --policies, and what differs is reported, per template and kind with its targets.
func TestPolicyReplayOfTheAuditLog(t *testing.T) {
	auditDir := t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: auditDir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	w := audit.NewWriter(sink)
	for _, tool := range []string{"read", "write", "drop"} {
		ev := audit.Event{Kind: audit.KindToolsCall, Identity: identity.Identity{Namespace: "ns", Sandbox: "sb", Template: "coder", Known: true},
			Target: audit.Target{Upstream: "db", Tool: tool}, Decision: audit.Decision{Allow: tool != "drop"}}
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))
	dir := t.TempDir()
	writePolicyFile(t, filepath.Join(dir, "serving", "p.rego"), replayPolicy)
	writePolicyFile(t, filepath.Join(dir, "edited", "p.rego"), replayPolicyEdited)

	for _, from := range []string{auditDir, filepath.Join(auditDir, audit.ActiveFile)} {
		code, out, errOut := runCLI(t, nil, "policy", "replay", "--policies", filepath.Join(dir, "edited"), "--baseline", filepath.Join(dir, "serving"),
			"--from", from, "--fail-on-change")
		assert.Equal(t, 1, code, "%s%s", out, errOut)
		assert.Contains(t, out, "replayed 3 of 3 audited calls (audit log")
		assert.Contains(t, out, "allow→deny 1, deny→allow 0")
		assert.Regexp(t, `1\s+allow→deny\s+mcp.tools_call\s+coder\s+read_ok → not_allowed\s+db/write \(1\)`, out)
	}
}
