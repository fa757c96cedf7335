package call_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// Run ends the call once, as Act's end says: an answer, a refusal Run answers (Refused), a
// refusal Act answered itself, a target answered as absent, or a failure of an allowed call.
func TestRunEndsTheCallAsActSays(t *testing.T) {
	core, kept := newKeptCore(t)
	id := identity.Identity{Known: true, Sandbox: "s"}
	spec := call.Spec{Kind: audit.KindToolsCall, Identity: id, Target: audit.Target{Tool: "echo"}}
	in := &policy.Input{Kind: audit.KindToolsCall, Identity: id}
	run := func(end call.End) string {
		return call.Run(context.Background(), core, spec, call.Steps[string]{
			Ask: func(ctx context.Context, cl *call.Call) (call.Question, *call.Refusal) {
				require.Same(t, cl, call.From(ctx), "Ask gets the call's context")
				return call.Question{Input: in}, nil
			},
			Act:     func(context.Context, *call.Call, call.Grant) (string, call.End) { return "answered", end },
			Refused: func(rf *call.Refusal) string { return "refused: " + rf.Code },
		})
	}
	assert.Equal(t, "answered", run(call.Answered(201)))
	assert.Equal(t, "refused: "+call.CodeUpstreamInputUnsupported, run(call.Refused(call.Refuse(call.CodeUpstreamInputUnsupported, "no capability"))))
	assert.Equal(t, "answered", run(call.Denied(call.Refuse("tool_denied", "policy says no"))))
	assert.Equal(t, "answered", run(call.Hidden(call.Refuse("tool_hidden", "not for you"))))
	assert.Equal(t, "answered", run(call.Failed(call.Refuse(call.CodeUpstreamError, "upstream broke"))))
	assert.Equal(t, "answered", run(call.Cancelled()))
	require.Len(t, kept.evs, 6)
	type outcome struct {
		allow  bool
		status int
		code   string
	}
	var got []outcome
	for _, ev := range kept.evs {
		got = append(got, outcome{ev.Decision.Allow, ev.Outcome.Status, ev.Outcome.Error})
	}
	assert.Equal(t, []outcome{
		{true, 201, ""},
		{false, 502, call.CodeUpstreamInputUnsupported},
		{false, 403, "tool_denied"},
		{false, 404, "tool_hidden"},
		{true, 502, call.CodeUpstreamError},
		{true, 499, call.CodeCancelled},
	}, got)
}

// A refusal at any step before Act ends the call and is answered by Refused: a full audit log
// (before Ask), Ask's own, policy's, a credential policy may not choose. Act never runs.
func TestRunRefusesBeforeAct(t *testing.T) {
	id := identity.Identity{Known: true, Sandbox: "s"}
	in := &policy.Input{Kind: audit.KindToolsCall, Identity: id}
	cases := []struct {
		name     string
		decision policy.Decision
		ask      *call.Refusal
		q        call.Question
		code     string
	}{
		{name: "Ask refuses", decision: policy.Decision{Allow: true}, ask: call.Refuse(call.CodeBadParams, "bad"), code: call.CodeBadParams},
		{name: "policy denies", decision: policy.Decision{Allow: false, Code: "nope", Reason: "no"}, q: call.Question{Input: in}, code: "nope"},
		{name: "policy names a credential the destination has not", decision: policy.Decision{Allow: true, Credential: "other"},
			q: call.Question{Input: in, Credential: "mine"}, code: call.CodeCredentialNotConfigured},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kept := &keptEvents{}
			core, err := call.New(call.Options{Audit: kept, Policy: fixedDecider{tc.decision}})
			require.NoError(t, err)
			got := call.Run(context.Background(), core, call.Spec{Kind: audit.KindToolsCall, Identity: id}, call.Steps[string]{
				Ask: func(context.Context, *call.Call) (call.Question, *call.Refusal) { return tc.q, tc.ask },
				Act: func(context.Context, *call.Call, call.Grant) (string, call.End) {
					t.Fatal("Act ran after a refusal")
					return "", call.End{}
				},
				Refused: func(rf *call.Refusal) string { return rf.Code },
			})
			assert.Equal(t, tc.code, got)
			require.Len(t, kept.evs, 1)
			assert.Equal(t, tc.code, kept.evs[0].Outcome.Error)
			assert.False(t, kept.evs[0].Decision.Allow)
		})
	}
}

// A client that cancelled while its call was decided ends it as cancelled: the refusal policy's
// evaluation made of a dead context is not a decision, and never a policy error.
func TestACancelDuringTheDecisionIsACancellation(t *testing.T) {
	kept := &keptEvents{}
	core, err := call.New(call.Options{Audit: kept, Policy: cancelledDecider{}})
	require.NoError(t, err)
	id := identity.Identity{Known: true, Sandbox: "s"}
	ctx, cancel := context.WithCancel(context.Background())
	got := call.Run(ctx, core, call.Spec{Kind: audit.KindToolsCall, Identity: id}, call.Steps[string]{
		Ask: func(context.Context, *call.Call) (call.Question, *call.Refusal) {
			cancel() // the client goes away while policy evaluates
			return call.Question{Input: &policy.Input{Kind: audit.KindToolsCall, Identity: id}}, nil
		},
		Act:     func(context.Context, *call.Call, call.Grant) (string, call.End) { return "answered", call.End{} },
		Refused: func(rf *call.Refusal) string { return rf.Code },
	})
	assert.Equal(t, call.CodeCancelled, got)
	require.Len(t, kept.evs, 1)
	assert.Equal(t, call.CodeCancelled, kept.evs[0].Outcome.Error)
	assert.Equal(t, 499, kept.evs[0].Outcome.Status)
}

// cancelledDecider fails as OPA does when the evaluation's context is cancelled.
type cancelledDecider struct{}

func (cancelledDecider) Decide(ctx context.Context, _ *policy.Input) policy.Decision {
	if ctx.Err() != nil {
		return policy.Decision{Allow: false, Code: "policy_error", Reason: "evaluation cancelled"}
	}
	return policy.Decision{Allow: true}
}
func (cancelledDecider) Revision() string { return "r" }

// A call Act hands on (Grant.Later) stays open when Run returns, and is written once when what
// carries it ends it; a refusal after Later still ends it at once.
func TestRunLeavesAHandedCallOpen(t *testing.T) {
	core, kept := newKeptCore(t)
	spec := call.Spec{Kind: audit.KindHTTPConnect, Identity: identity.Identity{Known: true, Sandbox: "s"},
		Target: audit.Target{Method: "CONNECT", Host: "api.example.com"}, BytesIn: 7}
	steps := func(end call.End, later *func(call.End)) call.Steps[struct{}] {
		return call.Steps[struct{}]{
			Ask: func(context.Context, *call.Call) (call.Question, *call.Refusal) { return call.Question{}, nil },
			Act: func(_ context.Context, _ *call.Call, g call.Grant) (struct{}, call.End) {
				*later = g.Later()
				return struct{}{}, end
			},
			Refused: func(*call.Refusal) struct{} { return struct{}{} },
		}
	}
	var later func(call.End)
	call.Run(context.Background(), core, spec, steps(call.Handed(), &later))
	assert.Empty(t, kept.evs, "the tunnel is still open: no event yet")
	later(call.Answered(200))
	later(call.Failed(call.Refuse(call.CodeUpstreamError, "late")))
	require.Len(t, kept.evs, 1, "ended once")
	assert.Equal(t, "api.example.com", kept.evs[0].Target.Host, "Spec's target is the event's")
	assert.Equal(t, int64(7), kept.evs[0].Outcome.BytesIn)
	assert.Equal(t, 200, kept.evs[0].Outcome.Status)

	call.Run(context.Background(), core, spec, steps(call.Refused(call.Refuse(call.CodeTooManyTunnels, "too many")), &later))
	require.Len(t, kept.evs, 2, "a refused call is written whether or not Act handed it on")
	assert.Equal(t, call.CodeTooManyTunnels, kept.evs[1].Outcome.Error)
}
