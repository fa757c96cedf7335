package policy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// evidenceData is the data of the replays below: triage may call echo and reach no host.
const evidenceData = `providers:
  anthropic: {hosts: [api.anthropic.com], credential: anthropic, requires_max_tokens: true}
templates:
  triage:
    tools: [{upstream: everything, allow: [echo]}]
    hosts: []
    models: {anthropic: {allow: [claude-haiku-4-5], max_tokens: 4096}}
`

// shippedWith is a folder of the shipped Rego (tests left out) with data.yaml as given.
func shippedWith(t *testing.T, data string) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join("..", "policies", "*.rego"))
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data.yaml"), []byte(data), 0o644))
	return dir
}

func engineAt(t *testing.T, dir string) *policy.Engine {
	t.Helper()
	e, err := policy.New(context.Background(), dir, policy.WithDecisionCache(0))
	require.NoError(t, err)
	return e
}

var triageID = identity.Identity{Namespace: "agents", Sandbox: "triage-1", Template: "triage", Known: true}

// A call of a tool the sandbox cannot see is on record like any other (input.mcp.visible
// false), so a replay of data that gives the template the tool shows it: the most common
// change there is, which used to be invisible ("not found" before any decision).
func TestReplayShowsTheNewToolOfATemplate(t *testing.T) {
	serving := engineAt(t, shippedWith(t, evidenceData))
	calls := []*policy.Input{
		{Kind: audit.KindToolsCall, Identity: triageID, MCP: &policy.MCP{Upstream: "everything", Tool: "add", Hidden: true}},
		{Kind: audit.KindToolsCall, Identity: triageID, MCP: &policy.MCP{Upstream: "everything", Tool: "echo"}},
		{Kind: audit.KindToolsCall, Identity: triageID, MCP: &policy.MCP{Tool: "nope", NotFound: true, Hidden: true}},
	}
	path := recordWith(t, serving, len(calls), nil, func(i int) *policy.Input { return calls[i] })

	candidate := engineAt(t, shippedWith(t, strings.Replace(evidenceData, "allow: [echo]", "allow: [echo, add]", 1)))
	r, err := policy.Replay(context.Background(), candidate, path, policy.ReplayOptions{Examples: 5})
	require.NoError(t, err)
	assert.Equal(t, 3, r.Replayed)
	assert.Equal(t, 1, r.DenyToAllow, "the hidden tool's call, and not the missing one's")
	assert.Equal(t, []policy.ReplayChange{{Direction: policy.DenyToAllow, Kind: "mcp.tools_call", Template: "triage",
		FromCode: "tool_not_allowed", ToCode: "tool_allowed", Count: 1,
		Targets: []policy.ReplayTarget{{Target: "everything/add", Count: 1}}}}, r.Changes)
	require.Len(t, r.Examples, 1)
	assert.Contains(t, r.Examples[0].Logged.Reason, "not in the sandbox's list", "the logged decision says the tool was hidden")
}

// auditLog writes events as serve does and returns the folder.
func auditLog(t *testing.T, events ...audit.Event) string {
	t.Helper()
	dir := t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: dir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	w := audit.NewWriter(sink)
	for i := range events {
		events[i].Time = time.Now()
		require.NoError(t, w.Record(&events[i]))
	}
	require.NoError(t, w.Close(context.Background()))
	return dir
}

func TestReplayOfTheAuditLogRebuildsWhatTheEventsHold(t *testing.T) {
	connect := audit.Event{Kind: audit.KindHTTPConnect, Identity: triageID,
		Target: audit.Target{Host: "proxy.golang.org"}, Decision: audit.Decision{Reason: "host not allowed"}}
	ping := audit.Event{Kind: audit.KindPing, Identity: triageID, Decision: audit.Decision{Allow: true}}
	dir := auditLog(t, connect, connect, ping)
	serving := engineAt(t, shippedWith(t, evidenceData))
	candidate := engineAt(t, shippedWith(t, strings.Replace(evidenceData, "hosts: []", "hosts: [proxy.golang.org]", 1)))

	r, err := policy.ReplayAudit(context.Background(), candidate, serving, dir, policy.ReplayOptions{})
	require.NoError(t, err)
	assert.Equal(t, policy.SourceAuditLog, r.Source)
	assert.Equal(t, serving.Revision(), r.Baseline)
	assert.Equal(t, 2, r.Read, "the ping is not a decision")
	assert.Equal(t, 2, r.DenyToAllow)
	assert.Equal(t, []policy.ReplayChange{{Direction: policy.DenyToAllow, Kind: "http.connect", Template: "triage",
		FromCode: "host_not_allowed", ToCode: "host_allowed", Count: 2,
		Targets: []policy.ReplayTarget{{Target: "CONNECT proxy.golang.org", Count: 2}}}}, r.Changes)

	r, err = policy.ReplayAudit(context.Background(), serving, serving, dir, policy.ReplayOptions{})
	require.NoError(t, err)
	assert.False(t, r.Changed(), "the serving policy against itself changes nothing")
}

// What an event does not hold, a policy that reads it cannot be replayed on: the error names the
// input it lacks and the event.
func TestReplayOfTheAuditLogNamesWhatAnEventLacks(t *testing.T) {
	serving := engineAt(t, shippedWith(t, evidenceData))
	cases := []struct {
		name string
		ev   audit.Event
		want string
	}{
		{"a tool call's arguments", audit.Event{Kind: audit.KindToolsCall, Identity: triageID,
			Target: audit.Target{Upstream: "everything", Tool: "echo"}, Decision: audit.Decision{Allow: true}},
			"reads input.grants, input.mcp.arguments, which audit events do not hold"},
		{"a model request's max_tokens", audit.Event{Kind: audit.KindHTTPRequest, Identity: triageID,
			Target:   audit.Target{Method: "POST", Host: "api.anthropic.com", Path: "/v1/messages", Route: "anthropic", Model: "claude-haiku-4-5"},
			Decision: audit.Decision{Allow: true}},
			"reads input.http.max_tokens, which audit events do not hold"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := auditLog(t, tc.ev)
			_, err := policy.ReplayAudit(context.Background(), serving, serving, dir, policy.ReplayOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "replay the decision log instead")
			assert.Regexp(t, `audit event \S+ \(`, err.Error())
		})
	}
}

// The audit log named as a decision log (the old failure: "decision  has no input").
func TestReplayOfAnAuditFileAsADecisionLogSaysWhichLogItIs(t *testing.T) {
	dir := auditLog(t, audit.Event{Kind: audit.KindHTTPConnect, Identity: triageID, Target: audit.Target{Host: "x"}})
	_, err := policy.Replay(context.Background(), engineAt(t, shippedWith(t, evidenceData)), filepath.Join(dir, audit.ActiveFile), policy.ReplayOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "this is an audit log, not a decision log")
}
