package call_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
)

// Run ends the call once whatever act does: an answer, a refusal (answered by refused), or a
// failure act ended the call with itself.
func TestRunEndsTheCallOnce(t *testing.T) {
	core, kept := newKeptCore(t)
	id := identity.Identity{Known: true, Sandbox: "s"}
	spec := call.Spec{Kind: audit.KindServerRequest, Identity: id, Target: audit.Target{Method: "roots/list"}}
	answer := func(rf *call.Refusal) string { return "refused: " + rf.Code }
	got := call.Run(context.Background(), core, spec, func(ctx context.Context, cl *call.Call) (string, *call.Refusal) {
		require.Same(t, cl, call.From(ctx), "act gets the call's context")
		cl.Answered(200)
		return "answered", nil
	}, answer)
	assert.Equal(t, "answered", got)
	got = call.Run(context.Background(), core, spec, func(context.Context, *call.Call) (string, *call.Refusal) {
		return "", call.Refuse(call.CodeUpstreamInputUnsupported, "no capability")
	}, answer)
	assert.Equal(t, "refused: "+call.CodeUpstreamInputUnsupported, got)
	got = call.Run(context.Background(), core, spec, func(_ context.Context, cl *call.Call) (string, *call.Refusal) {
		cl.Fail(call.Refuse(call.CodeUpstreamInputUnanswered, "no answer"))
		return "interrupted", nil
	}, answer)
	assert.Equal(t, "interrupted", got)
	require.Len(t, kept.evs, 3)
	assert.Equal(t, [3]int{200, 502, 502}, [3]int{kept.evs[0].Outcome.Status, kept.evs[1].Outcome.Status, kept.evs[2].Outcome.Status})
	assert.Equal(t, [3]bool{true, false, false}, [3]bool{kept.evs[0].Decision.Allow, kept.evs[1].Decision.Allow, kept.evs[2].Decision.Allow})
	assert.Equal(t, call.CodeUpstreamInputUnanswered, kept.evs[2].Outcome.Error)
}

// A call act hands on (Outlive) stays open when Run returns, and is written once when what
// carries it finishes it; a refusal after Outlive still ends it at once.
func TestRunLeavesAnOutlivingCallOpen(t *testing.T) {
	core, kept := newKeptCore(t)
	spec := call.Spec{Kind: audit.KindHTTPConnect, Identity: identity.Identity{Known: true, Sandbox: "s"},
		Target: audit.Target{Method: "CONNECT", Host: "api.example.com"}, BytesIn: 7}
	refused := func(rf *call.Refusal) *call.Call { return nil }
	cl := call.Run(context.Background(), core, spec, func(_ context.Context, cl *call.Call) (*call.Call, *call.Refusal) {
		cl.Outlive()
		return cl, nil
	}, refused)
	require.NotNil(t, cl)
	assert.Empty(t, kept.evs, "the tunnel is still open: no event yet")
	cl.Answered(200)
	cl.Finish()
	require.Len(t, kept.evs, 1)
	assert.Equal(t, "api.example.com", kept.evs[0].Target.Host, "Spec's target is the event's")
	assert.Equal(t, int64(7), kept.evs[0].Outcome.BytesIn)

	call.Run(context.Background(), core, spec, func(_ context.Context, cl *call.Call) (*call.Call, *call.Refusal) {
		cl.Outlive()
		return nil, call.Refuse(call.CodeTooManyTunnels, "too many")
	}, refused)
	require.Len(t, kept.evs, 2, "a refused call is written whether or not act handed it on")
	assert.Equal(t, call.CodeTooManyTunnels, kept.evs[1].Outcome.Error)
}
