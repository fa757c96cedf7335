package call_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// shippedPolicies is a copy of the shipped Rego with data of the test's: template "observed"
// in report-only mode (enforce: false), template "enforced" not.
func shippedPolicies(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join("..", "..", "policies", "*.rego"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	data := `providers: {}
templates:
  observed:
    enforce: false
    tools: [{upstream: everything, allow: [echo]}]
    hosts: []
    models: {}
  enforced:
    tools: [{upstream: everything, allow: [echo]}]
    hosts: []
    models: {}
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data.yaml"), []byte(data), 0o644))
	return dir
}

type reportRun struct {
	core    *call.Core
	writer  *audit.Writer
	dl      *policy.DecisionLog
	reader  *sdkmetric.ManualReader
	dir     string
	decided []policy.Decision
}

func newReportRun(t *testing.T, policyDir string) *reportRun {
	t.Helper()
	r := &reportRun{dir: t.TempDir(), reader: sdkmetric.NewManualReader()}
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: filepath.Join(r.dir, "audit")})
	require.NoError(t, err)
	r.writer = audit.NewWriter(sink)
	r.dl, err = policy.OpenDecisionLog(policy.DecisionLogConfig{File: filepath.Join(r.dir, "decisions.log")})
	require.NoError(t, err)
	eng, err := policy.New(t.Context(), policyDir)
	require.NoError(t, err)
	r.core, err = call.New(call.Options{Audit: r.writer, Policy: eng, Decisions: r.dl,
		Meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))})
	require.NoError(t, err)
	return r
}

// call runs one call of kind for a sandbox of template, as a half does, and returns whether
// it was refused.
func (r *reportRun) call(t *testing.T, template string, kind audit.Kind, in *policy.Input) *call.Refusal {
	t.Helper()
	id := identity.Identity{Namespace: "agents", Sandbox: template + "-1", Template: template, Known: true}
	in.Kind, in.Identity = kind, id
	d, rf, _ := decide(r.core, kind, id, call.Question{Input: in})
	r.decided = append(r.decided, d)
	return rf
}

// decide runs one call of kind asking q, answered 200 when allowed, and returns its decision
// (when allowed), its refusal (when refused) and the call.
func decide(core *call.Core, kind audit.Kind, id identity.Identity, q call.Question) (policy.Decision, *call.Refusal, *call.Call) {
	var d policy.Decision
	var refused *call.Refusal
	var c *call.Call
	call.Run(context.Background(), core, call.Spec{Kind: kind, Identity: id}, call.Steps[struct{}]{
		Ask: func(_ context.Context, cl *call.Call) (call.Question, *call.Refusal) {
			c = cl
			return q, nil
		},
		Act: func(_ context.Context, _ *call.Call, g call.Grant) (struct{}, call.End) {
			d = g.Decision
			return struct{}{}, call.Answered(200)
		},
		Refused: func(rf *call.Refusal) struct{} {
			refused = rf
			return struct{}{}
		},
	})
	return d, refused, c
}

func (r *reportRun) events(t *testing.T) []audit.Event {
	t.Helper()
	require.NoError(t, r.writer.Close(context.Background()))
	res, err := audit.Query(context.Background(), filepath.Join(r.dir, "audit"), audit.Filter{Limit: -1})
	require.NoError(t, err)
	return res.Events
}

func (r *reportRun) loggedResults(t *testing.T) []policy.Decision {
	t.Helper()
	require.NoError(t, r.dl.Close())
	b, err := os.ReadFile(filepath.Join(r.dir, "decisions.log"))
	require.NoError(t, err)
	var out []policy.Decision
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		ev, err := policy.ReadDecisionEvent([]byte(line))
		require.NoError(t, err)
		out = append(out, policy.DecisionFromResult(ev.Result, ""))
	}
	return out
}

func TestReportOnlyTemplateLetsDenialsThroughAndRecordsThem(t *testing.T) {
	r := newReportRun(t, shippedPolicies(t))
	connect := func() *policy.Input {
		return &policy.Input{HTTP: &policy.HTTP{Method: "CONNECT", Host: "proxy.golang.org", Port: 443}}
	}
	tool := func(name string) *policy.Input {
		return &policy.Input{MCP: &policy.MCP{Upstream: "everything", Tool: name}}
	}

	assert.Nil(t, r.call(t, "observed", audit.KindHTTPConnect, connect()), "a would-be denial of a report-only template goes on")
	assert.Nil(t, r.call(t, "observed", audit.KindToolsCall, tool("add")))
	assert.Nil(t, r.call(t, "observed", audit.KindToolsCall, tool("echo")), "an allowed call stays allowed")
	rf := r.call(t, "enforced", audit.KindHTTPConnect, connect())
	require.NotNil(t, rf, "a template without enforce: false enforces")
	assert.Equal(t, "host_not_allowed", rf.Code)
	rf = r.call(t, "observed", audit.KindToolsCall, &policy.Input{MCP: &policy.MCP{Tool: "nope", NotFound: true}})
	require.NotNil(t, rf, "a target that does not exist is never let through")
	assert.Equal(t, "not_found", rf.Code)

	assert.True(t, r.decided[0].Allow && r.decided[0].ReportOnly, "the half sees an allowed decision that says it was report-only")

	evs := r.events(t)
	require.Len(t, evs, 5)
	for i, want := range []struct {
		allow              bool
		wouldDeny, outcome string
	}{
		{true, "host_not_allowed", ""}, {true, "tool_not_allowed", ""}, {true, "", ""},
		{false, "", "host_not_allowed"}, {false, "", "not_found"},
	} {
		assert.Equal(t, want.allow, evs[i].Decision.Allow, "event %d", i)
		assert.Equal(t, want.wouldDeny, evs[i].Decision.WouldDeny, "event %d", i)
		assert.Equal(t, want.outcome, evs[i].Outcome.Error, "event %d", i)
	}
	assert.Contains(t, evs[0].Decision.Reason, `host "proxy.golang.org" is not allowed`, "the event keeps the policy's reason for the denial")

	logged := r.loggedResults(t)
	require.Len(t, logged, 5)
	assert.False(t, logged[0].Allow, "the decision log keeps what the policy answered")
	assert.True(t, logged[0].ReportOnly, "…and that it was not enforced")
	assert.False(t, logged[3].ReportOnly)

	assert.Equal(t, map[string]int64{"host_not_allowed": 1, "tool_not_allowed": 1}, divergences(t, r.reader, "sandgate.policy.report_only"))
}

// The engine's own denials (an evaluation error, no policy) are fail-closed refusals even
// where the policy marks its denials report-only.
func TestReportOnlyNeverOpensAnEngineDenial(t *testing.T) {
	eng := policyEngine(t, `package sandgate

decision := {"allow": false, "reason": "would deny", "code": "nope", "enforce": false} if input.kind == "mcp.tools_call"

decision := {"allow": to_number("x") == 1} if input.kind == "http.connect"
`)
	core, err := call.New(call.Options{Audit: discardRecorder{}, Policy: eng})
	require.NoError(t, err)
	id := identity.Identity{Known: true}
	_, rf, _ := decide(core, audit.KindToolsCall, id, call.Question{Input: &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{}}})
	assert.Nil(t, rf)
	_, rf, _ = decide(core, audit.KindHTTPConnect, id, call.Question{Input: &policy.Input{Kind: audit.KindHTTPConnect, Identity: id, HTTP: &policy.HTTP{}}})
	require.NotNil(t, rf)
	assert.Equal(t, policy.CodeEvalError, rf.Code)
}

// A list's visibility check (Core.Decide) of a report-only template shows what its calls
// would be let through with; of an enforced template it hides.
func TestReportOnlyTemplateSeesWhatItMayCall(t *testing.T) {
	r := newReportRun(t, shippedPolicies(t))
	list := func(template string) bool {
		return r.core.Decide(context.Background(), &policy.Input{Kind: audit.KindToolsList,
			Identity: identity.Identity{Template: template, Known: true}, MCP: &policy.MCP{Upstream: "everything", Tool: "add"}}).Allow
	}
	assert.True(t, list("observed"))
	assert.False(t, list("enforced"))
}

// The shadow policy sees what the enforced one sees: a call of a hidden tool (as the gateway
// decides it, input.mcp.visible false) is evaluated under a candidate that gives the template
// the tool, and diverges; the call answers as a missing tool.
func TestShadowSeesTheCallOfAHiddenTool(t *testing.T) {
	serving := shippedPolicies(t)
	candidate := shippedPolicies(t)
	require.NoError(t, os.WriteFile(filepath.Join(candidate, "data.yaml"), []byte(`providers: {}
templates:
  enforced:
    tools: [{upstream: everything, allow: [echo, add]}]
`), 0o644))
	shadowEngine, err := policy.NewShadowEngine(t.Context(), candidate)
	require.NoError(t, err)
	shadow := policy.NewShadow(shadowEngine, policy.ShadowConfig{})
	go func() { _ = shadow.Run(t.Context()) }()
	r := newReportRun(t, serving)
	core, err := call.New(call.Options{Audit: r.writer, Policy: policyEngineAt(t, serving), Shadow: shadow})
	require.NoError(t, err)
	r.core = core

	id := identity.Identity{Namespace: "agents", Sandbox: "enforced-1", Template: "enforced", Known: true}
	_, rf, cl := decide(core, audit.KindToolsCall, id, call.Question{Hidden: true, Input: &policy.Input{Kind: audit.KindToolsCall, Identity: id,
		MCP: &policy.MCP{Upstream: "everything", Tool: "add", Hidden: true}}})
	require.NotNil(t, rf)
	<-cl.Shadow().Done()
	counts := shadow.Counts() // late or not: the event is never held back for the shadow
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{counts.Evaluated, counts.Diverged},
		"the candidate that gives the template the tool allows the hidden call")
	evs := r.events(t)
	require.Len(t, evs, 1)
	assert.Equal(t, 404, evs[0].Outcome.Status, "a hidden tool answers as a missing one")
	assert.Contains(t, evs[0].Decision.Reason, "not in the sandbox's list")
}

func policyEngineAt(t *testing.T, dir string) *policy.Engine {
	t.Helper()
	e, err := policy.New(t.Context(), dir)
	require.NoError(t, err)
	return e
}

// A changed tool definition is one event: the upstream and tool, a denial that says what changed,
// outcome tool_changed, the serving revision, and no caller.
func TestToolChangedIsOneEvent(t *testing.T) {
	r := newReportRun(t, shippedPolicies(t))
	require.NoError(t, r.core.ToolChanged("everything", "echo", "description"))
	evs := r.events(t)
	require.Len(t, evs, 1)
	ev := evs[0]
	assert.Equal(t, audit.KindToolChanged, ev.Kind)
	assert.Equal(t, audit.Target{Upstream: "everything", Tool: "echo"}, ev.Target)
	assert.False(t, ev.Decision.Allow)
	assert.Contains(t, ev.Decision.Reason, "(description)")
	assert.NotEmpty(t, ev.Decision.PolicyRevision)
	assert.Equal(t, audit.ToolChangedCode, ev.Outcome.Error)
	assert.False(t, ev.Identity.Known)
	assert.NotEmpty(t, ev.ID)
}
