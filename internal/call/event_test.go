package call_test

import (
	"context"
	"reflect"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// keptEvents keeps a copy of every event recorded.
type keptEvents struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (k *keptEvents) Record(ev *audit.Event) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.evs = append(k.evs, *ev)
	return nil
}
func (k *keptEvents) Healthy() error { return nil }

// runCall runs one call of kind by id through Run: Ask asks q, and Act (once allowed) notes what
// act does and ends the call as it says (nil: answered 200). It returns the call, the grant Act
// got and the refusal Run answered (nil when none).
func runCall(ctx context.Context, core *call.Core, kind audit.Kind, id identity.Identity, q call.Question,
	act func(*call.Call, call.Grant) call.End) (*call.Call, call.Grant, *call.Refusal) {
	var c *call.Call
	var g call.Grant
	var refused *call.Refusal
	call.Run(ctx, core, call.Spec{Kind: kind, Identity: id}, call.Steps[struct{}]{
		Ask: func(_ context.Context, cl *call.Call) (call.Question, *call.Refusal) {
			c = cl
			return q, nil
		},
		Act: func(_ context.Context, cl *call.Call, gr call.Grant) (struct{}, call.End) {
			g = gr
			if act == nil {
				return struct{}{}, call.Answered(200)
			}
			return struct{}{}, act(cl, gr)
		},
		Refused: func(rf *call.Refusal) struct{} {
			refused = rf
			return struct{}{}
		},
	})
	return c, g, refused
}

func newKeptCore(t *testing.T) (*call.Core, *keptEvents) {
	kept := &keptEvents{}
	core, err := call.New(call.Options{Audit: kept, Policy: fixedDecider{policy.Decision{Allow: true, Revision: "r1"}}})
	require.NoError(t, err)
	return core, kept
}

// Describe carries every field of a target a half sets, and leaves the others as noted: a
// field added to audit.Target that Describe forgets fails here.
func TestDescribeCarriesEveryTargetField(t *testing.T) {
	core, kept := newKeptCore(t)
	var full audit.Target
	v := reflect.ValueOf(&full).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.String:
			f.SetString(v.Type().Field(i).Name)
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		default:
			t.Fatalf("audit.Target.%s is a %s: teach Describe (event.go) and this test about it", v.Type().Field(i).Name, f.Kind())
		}
	}
	runCall(context.Background(), core, audit.KindHTTPRequest, identity.Identity{Known: true}, call.Question{},
		func(cl *call.Call, _ call.Grant) call.End {
			cl.Describe(audit.Target{Host: "first"})
			cl.Describe(full)
			cl.Describe(audit.Target{})
			assert.Equal(t, full, cl.Target())
			return call.Answered(200)
		})
	require.Len(t, kept.evs, 1)
	assert.Equal(t, full, kept.evs[0].Target)
}

// What a half notes after its call ended does not change the event that was written (an
// answer's status or echo noted by a deferred step after a refusal had ended the call).
func TestNotesAfterTheEndChangeNothing(t *testing.T) {
	core, kept := newKeptCore(t)
	var end func(call.End)
	cl, _, _ := runCall(context.Background(), core, audit.KindHTTPRequest, identity.Identity{Known: true},
		call.Question{Input: &policy.Input{Kind: audit.KindHTTPRequest}}, func(cl *call.Call, g call.Grant) call.End {
			cl.Describe(audit.Target{Host: "api.example"})
			cl.Note("first")
			cl.Note("second") // the first code noted stands
			assert.Equal(t, "first", cl.OutcomeError())
			end = g.Later()
			return call.Handed()
		})
	assert.Empty(t, kept.evs, "handed on: not ended yet")
	end(call.Refused(call.Refuse(call.CodeBodyTooLarge, "too large")))
	cl.Describe(audit.Target{Host: "other"})
	cl.Answered(200)
	cl.CredentialEchoed()
	cl.UsesCredential("anthropic")
	cl.SetUsage(1, 2)
	end(call.Failed(call.Refuse(call.CodeUpstreamError, "late")))
	end(call.Hidden(call.Refuse(call.CodeNotFound, "late")))
	require.Len(t, kept.evs, 1)
	ev := kept.evs[0]
	assert.Equal(t, "api.example", ev.Target.Host)
	assert.Equal(t, call.CodeBodyTooLarge, ev.Outcome.Error)
	assert.Equal(t, 413, ev.Outcome.Status)
	assert.False(t, ev.Outcome.CredentialEchoed)
	assert.Empty(t, ev.Credential)
	assert.Zero(t, ev.Outcome.TokensIn+ev.Outcome.TokensOut)
}

// Answered keeps a status an end already noted; NoteRefusal and NoteFailure set what Refuse
// and Fail set without ending the call.
func TestNotedOutcomesStand(t *testing.T) {
	core, kept := newKeptCore(t)
	runCall(context.Background(), core, audit.KindToolsCall, identity.Identity{Known: true}, call.Question{},
		func(cl *call.Call, _ call.Grant) call.End {
			cl.NoteRefusal(call.Refuse(call.CodeNotFound, "not found or not visible to the caller"))
			return call.Answered(200)
		})
	_, _, rf := runCall(context.Background(), core, audit.KindHTTPConnect, identity.Identity{Known: true},
		call.Question{Input: &policy.Input{Kind: audit.KindHTTPConnect, Identity: identity.Identity{Known: true}}},
		func(cl *call.Call, _ call.Grant) call.End {
			cl.NoteFailure(call.Refuse(call.CodeResolveFailed, "no such host"))
			cl.SetUsage(3, 4)
			return call.Answered(200)
		})
	require.Nil(t, rf)
	require.Len(t, kept.evs, 2)
	r, f := kept.evs[0], kept.evs[1]
	assert.Equal(t, audit.Decision{Allow: false, Reason: "not found or not visible to the caller", PolicyRevision: "r1"}, r.Decision)
	assert.Equal(t, 404, r.Outcome.Status)
	assert.Equal(t, call.CodeNotFound, r.Outcome.Error)
	assert.True(t, f.Decision.Allow, "a failure leaves the decision: %+v", f.Decision)
	assert.Equal(t, 502, f.Outcome.Status)
	assert.Equal(t, [2]int64{3, 4}, [2]int64{f.Outcome.TokensIn, f.Outcome.TokensOut})
}

// An upstream's failure is answered with its code's fixed reason; the words of what failed
// are the event's detail only, cut short, for a refusal and a failure alike.
func TestUpstreamFailureKeepsItsDetailInTheEventOnly(t *testing.T) {
	core, kept := newKeptCore(t)
	detail := `malformed HTTP status code "canary" ` + string(make([]byte, 600))
	rf := call.UpstreamFailure(call.CodeUpstreamError, detail)
	assert.NotContains(t, rf.Reason, "canary")
	assert.Equal(t, call.UpstreamFailure(call.CodeUpstreamError, "other words").Reason, rf.Reason, "one text per code")
	assert.Equal(t, call.CodeUpstreamError, call.UpstreamFailure("not_an_upstream_code", "x").Code)
	runCall(context.Background(), core, audit.KindHTTPRequest, identity.Identity{Known: true}, call.Question{},
		func(*call.Call, call.Grant) call.End { return call.Failed(rf) })
	runCall(context.Background(), core, audit.KindHTTPRequest, identity.Identity{Known: true}, call.Question{},
		func(*call.Call, call.Grant) call.End {
			return call.Refused(call.UpstreamFailure(call.CodeUpstreamEncoding, "coding 2 of 2"))
		})
	require.Len(t, kept.evs, 2)
	assert.Contains(t, kept.evs[0].Outcome.Detail, "canary")
	assert.Len(t, kept.evs[0].Outcome.Detail, 512)
	assert.Equal(t, "coding 2 of 2", kept.evs[1].Outcome.Detail)
	assert.NotContains(t, kept.evs[0].Decision.Reason, "canary")
}
