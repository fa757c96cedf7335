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
	answer := func(rf *call.Refusal) string { return "refused: " + rf.Code }
	got := call.Run(context.Background(), core, audit.KindServerRequest, id, func(ctx context.Context, cl *call.Call) (string, *call.Refusal) {
		require.Same(t, cl, call.From(ctx), "act gets the call's context")
		cl.Answered(200)
		return "answered", nil
	}, answer)
	assert.Equal(t, "answered", got)
	got = call.Run(context.Background(), core, audit.KindServerRequest, id, func(context.Context, *call.Call) (string, *call.Refusal) {
		return "", call.Refuse(call.CodeUpstreamInputUnsupported, "no capability")
	}, answer)
	assert.Equal(t, "refused: "+call.CodeUpstreamInputUnsupported, got)
	got = call.Run(context.Background(), core, audit.KindServerRequest, id, func(_ context.Context, cl *call.Call) (string, *call.Refusal) {
		cl.Fail(call.Refuse(call.CodeUpstreamInputUnanswered, "no answer"))
		return "interrupted", nil
	}, answer)
	assert.Equal(t, "interrupted", got)
	require.Len(t, kept.evs, 3)
	assert.Equal(t, [3]int{200, 502, 502}, [3]int{kept.evs[0].Outcome.Status, kept.evs[1].Outcome.Status, kept.evs[2].Outcome.Status})
	assert.Equal(t, [3]bool{true, false, false}, [3]bool{kept.evs[0].Decision.Allow, kept.evs[1].Decision.Allow, kept.evs[2].Decision.Allow})
	assert.Equal(t, call.CodeUpstreamInputUnanswered, kept.evs[2].Outcome.Error)
}
