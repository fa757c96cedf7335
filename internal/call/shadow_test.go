package call_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

const enforcedEcho = `package sandgate

default decision := {"allow": false, "reason": "only echo", "code": "not_echo"}

decision := {"allow": true, "reason": "echo is fine"} if input.mcp.tool == "echo"
`

// The candidate denies everything, with the same code the enforced policy denies with: it
// differs from the enforced policy exactly on the echo calls.
const shadowDenyAll = `package sandgate

decision := {"allow": false, "reason": "candidate denies all", "code": "not_echo"}
`

func policyEngine(t *testing.T, src string) *policy.Engine {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p.rego"), []byte(src), 0o644))
	e, err := policy.New(t.Context(), dir)
	require.NoError(t, err)
	return e
}

type shadowRun struct {
	core   *call.Core
	writer *audit.Writer
	dir    string
}

func newShadowRun(t *testing.T, shadow *policy.Shadow) *shadowRun {
	t.Helper()
	dir := t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: filepath.Join(dir, "audit")})
	require.NoError(t, err)
	r := &shadowRun{writer: audit.NewWriter(sink), dir: dir}
	opts := call.Options{Audit: r.writer, Policy: policyEngine(t, enforcedEcho)}
	if shadow != nil {
		opts.Shadow = shadow
	}
	r.core, err = call.New(opts)
	require.NoError(t, err)
	return r
}

// call runs one tools/call; wait decides whether the test lets the shadow finish before the
// event is written.
func (r *shadowRun) call(t *testing.T, tool string, wait bool) *call.Call {
	id := identity.Identity{Namespace: "team-a", Sandbox: "sb", Known: true}
	in := &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: "gh", Tool: tool}}
	cl, _, rf := runCall(context.Background(), r.core, audit.KindToolsCall, id, call.Question{Input: in}, func(cl *call.Call, _ call.Grant) call.End {
		if wait && cl.Shadow() != nil {
			<-cl.Shadow().Done() // before the event is written: a divergence goes into it
		}
		return call.Answered(200)
	})
	if rf != nil && wait && cl.Shadow() != nil {
		<-cl.Shadow().Done() // the shadow of a refusal is counted; its event was written
	}
	return cl
}

func (r *shadowRun) events(t *testing.T) []audit.Event {
	require.NoError(t, r.writer.Close(context.Background()))
	res, err := audit.Query(context.Background(), filepath.Join(r.dir, "audit"), audit.Filter{})
	require.NoError(t, err)
	return res.Events
}

func divergences(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				code, _ := dp.Attributes.Value("code")
				got[code.AsString()] += dp.Value
			}
		}
	}
	return got
}

func TestShadowDivergesInAuditAndMetricsWithoutChangingOutcomes(t *testing.T) {
	tools := []string{"echo", "delete_repo", "echo", "search", "echo"}
	plain := newShadowRun(t, nil)
	for _, tool := range tools {
		plain.call(t, tool, false)
	}
	want := plain.events(t)

	reader := sdkmetric.NewManualReader()
	shadow := policy.NewShadow(policyEngine(t, shadowDenyAll), policy.ShadowConfig{
		Meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	go func() { _ = shadow.Run(t.Context()) }()
	shadowed := newShadowRun(t, shadow)
	for _, tool := range tools {
		shadowed.call(t, tool, true)
	}
	got := shadowed.events(t)

	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, want[i].Decision, got[i].Decision, "call %d (%s): the shadow changed the decision", i, tools[i])
		assert.Equal(t, want[i].Outcome.Status, got[i].Outcome.Status, "call %d", i)
		assert.Equal(t, want[i].Outcome.Error, got[i].Outcome.Error, "call %d", i)
		assert.Nil(t, want[i].Shadow)
		if tools[i] == "echo" {
			require.NotNil(t, got[i].Shadow, "call %d: an allow the shadow denies is a divergence", i)
			assert.Equal(t, audit.ShadowDecision{Allow: false, Reason: "candidate denies all", Code: "not_echo",
				Revision: shadow.Engine().Revision()}, *got[i].Shadow)
		} else {
			assert.Nil(t, got[i].Shadow, "call %d: the shadow agrees, so the event says nothing", i)
		}
	}
	assert.Equal(t, map[string]int64{"not_echo": 3}, divergences(t, reader, "sandgate.policy.shadow.divergences"))
	assert.Equal(t, policy.ShadowCounts{Evaluated: 5, Diverged: 3}, shadow.Counts())
}

func TestShadowLateDivergenceGoesToMetricsAndDecisionLogNotTheEvent(t *testing.T) {
	dlPath := filepath.Join(t.TempDir(), "decisions.log")
	dl, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: dlPath})
	require.NoError(t, err)
	shadow := policy.NewShadow(policyEngine(t, shadowDenyAll), policy.ShadowConfig{Decisions: dl})
	run := newShadowRun(t, shadow)
	// No worker runs yet: the event is written while the shadow is still queued.
	cl := run.call(t, "echo", false)
	events := run.events(t)
	require.Len(t, events, 1)
	assert.True(t, events[0].Decision.Allow)
	assert.Nil(t, events[0].Shadow, "the event is never held back for the shadow")

	go func() { _ = shadow.Run(t.Context()) }()
	<-cl.Shadow().Done()
	assert.Equal(t, policy.ShadowCounts{Evaluated: 1, Diverged: 1, Late: 1}, shadow.Counts())
	require.NoError(t, dl.Close())

	f, err := os.Open(dlPath)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	require.True(t, sc.Scan())
	var ev logs.EventV1
	require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
	assert.Equal(t, events[0].ID, ev.DecisionID)
	assert.Equal(t, policy.ShadowPath, ev.Path)
	assert.Equal(t, false, (*ev.Result).(map[string]any)["allow"])
	assert.False(t, sc.Scan(), "one line: the divergence")
}

func TestShadowQueueFullDropsAndCountsWithoutChangingOutcomes(t *testing.T) {
	shadow := policy.NewShadow(policyEngine(t, shadowDenyAll), policy.ShadowConfig{QueueSize: 1})
	run := newShadowRun(t, shadow)
	first := run.call(t, "echo", false)
	second := run.call(t, "echo", false)
	assert.NotNil(t, first.Shadow())
	assert.Nil(t, second.Shadow(), "the queue holds one: the second call is not shadowed")
	events := run.events(t)
	require.Len(t, events, 2)
	for _, ev := range events {
		assert.True(t, ev.Decision.Allow)
		assert.Equal(t, 200, ev.Outcome.Status)
	}
	assert.Equal(t, uint64(1), shadow.Counts().Dropped)
}

// The shadow folder reloads like the enforced one (Watch calls Reload on a change): after the
// candidate is edited to agree with the enforced policy, calls stop diverging.
func TestShadowFolderReloadChangesTheCandidate(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p.rego"), []byte(shadowDenyAll), 0o644))
	se, err := policy.NewShadowEngine(t.Context(), dir)
	require.NoError(t, err)
	shadow := policy.NewShadow(se, policy.ShadowConfig{})
	go func() { _ = shadow.Run(t.Context()) }()
	run := newShadowRun(t, shadow)
	run.call(t, "echo", true)
	before := se.Revision()

	require.NoError(t, os.WriteFile(filepath.Join(dir, "p.rego"), []byte(enforcedEcho), 0o644))
	require.NoError(t, se.Reload(t.Context()))
	require.NotEqual(t, before, se.Revision())
	run.call(t, "echo", true)

	events := run.events(t)
	require.Len(t, events, 2)
	require.NotNil(t, events[0].Shadow)
	assert.Equal(t, before, events[0].Shadow.Revision)
	assert.Nil(t, events[1].Shadow, "the reloaded candidate agrees")
	assert.Equal(t, policy.ShadowCounts{Evaluated: 2, Diverged: 1}, shadow.Counts())
}
