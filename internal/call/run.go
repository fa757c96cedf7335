package call

import (
	"context"
	"net/http"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// Spec is what a connection server knows of a call before it begins: its kind, its caller, what
// its request names and how many body bytes it read to learn that.
type Spec struct {
	Kind     audit.Kind
	Identity identity.Identity
	Target   audit.Target
	// Span names the call's span; the kind when empty.
	Span    string
	BytesIn int64
}

// Steps are what a half supplies for one call, as httputil.ReverseProxy's hook fields are what
// varies between its uses: how the request is read, what is done once it is allowed, and how a
// refusal is answered in the half's protocol. Run does everything else, in the same order for
// both halves.
type Steps[T any] struct {
	// Ask reads what the request asks: it notes the target (Describe) and returns the question
	// for policy, or a Question without Input for a call no policy decides (an MCP initialize,
	// a list the gateway answers itself), or a refusal.
	Ask func(ctx context.Context, cl *Call) (Question, *Refusal)
	// Act does what was asked, once allowed, and returns the answer and how the call ended.
	Act func(ctx context.Context, cl *Call, g Grant) (T, End)
	// Refused answers a refusal, after Run ended the call with it (its event is written).
	Refused func(*Refusal) T
}

// Question is what a call asks policy.
type Question struct {
	// Input is the policy input; nil when no policy decides the call.
	Input *policy.Input
	// Admit counts the call against the caller's budgets (admission) before policy decides.
	Admit bool
	// Credential is the name of the credential the destination is configured with ("": none):
	// the only one that can ever be injected (takeCredential).
	Credential string
	// Opaque says the call injects nothing whatever policy names (a CONNECT: the requests of its
	// tunnel are decided, and given their credential, each).
	Opaque bool
	// Hidden answers a refusal of the decision as if the target did not exist (404): what the
	// caller may not read looks like what does not exist.
	Hidden bool
}

// Grant is what Run hands Act: the decision, and the credential to inject.
type Grant struct {
	// Decision is policy's (the zero decision when none was asked).
	Decision policy.Decision
	// Credential is the value of the credential to inject ("": none); it is never kept.
	Credential string
	cl         *Call
}

// Later hands the call's end to what carries on after Run returns (a relayed or intercepted
// tunnel, whose close ends it): Run then leaves the call open, and the returned function ends
// it, once, as End says. Only Act calls it, on Run's goroutine.
func (g Grant) Later() func(End) {
	g.cl.outlives = true
	return g.cl.end
}

// End is how a call ended, as Act returns it; Run ends the call so. Its zero value is
// Answered(200).
type End struct {
	how    endHow
	status int
	rf     *Refusal
}

type endHow uint8

const (
	endAnswered endHow = iota
	endRefused         // Run answers the refusal (Steps.Refused)
	endDenied          // refused, answered by Act already
	endHidden          // refused, answered by Act as if the target did not exist
	endFailed          // allowed, and the action failed (answered by Act)
	endLater           // Act handed the end on (Grant.Later)
	endRecorded        // the event says it all already (a count of suppressed rejections)
)

// Answered ends a call that was answered with status.
func Answered(status int) End { return End{how: endAnswered, status: status} }

// Refused ends a call refused by rf, which Run answers (Steps.Refused).
func Refused(rf *Refusal) End { return End{how: endRefused, rf: rf} }

// Denied ends a call refused by rf that Act has answered itself (a tool error result, a
// refusal written by the proxy's error handler).
func Denied(rf *Refusal) End { return End{how: endDenied, rf: rf} }

// Hidden ends a call refused by rf that Act answered as if its target did not exist (404): the
// event keeps rf's reason and code.
func Hidden(rf *Refusal) End { return End{how: endHidden, rf: rf} }

// Failed ends an allowed call whose action failed as rf says (an upstream error), answered by
// Act: the decision stands, the outcome says what went wrong.
func Failed(rf *Refusal) End { return End{how: endFailed, rf: rf} }

// Handed is what Act returns after it handed the call's end on (Grant.Later).
func Handed() End { return End{how: endLater} }

// Cancelled is the end of a call whose client went away or cancelled it before it was
// answered: never a policy error or a refusal of Sandgate's.
func Cancelled() End { return Failed(cancelled()) }

func cancelled() *Refusal { return Refuse(CodeCancelled, "the client cancelled the request") }

// Run is the one sequence of every call: begin, the check that the audit log has room for its
// event (fail closed: nothing else is answered), Ask, the decision (audit health, admission,
// policy) and the credential, Act, and the end Act names; a refusal at any step ends the call
// before Steps.Refused answers it. The step methods of Call (authorize, takeCredential, refuse,
// hide, fail, finish) are called here and nowhere else (test/layout keeps it so), which is what
// makes one refusal end a call the same way on both halves.
//
// A client that cancels (or goes away) while the call is being decided ends it as cancelled,
// never as a policy error: a decision made for a request nobody waits for is not one.
func Run[T any](ctx context.Context, c *Core, s Spec, h Steps[T]) T {
	ctx, cl := c.begin(ctx, s.Kind, s.Identity)
	if s.Span != "" {
		cl.span.SetName(s.Span)
	}
	cl.Describe(s.Target)
	cl.BytesIn.Store(s.BytesIn)
	g, rf := cl.decide(ctx, h.Ask)
	if rf != nil {
		switch {
		case rf.Code == CodeCancelled:
			cl.fail(rf)
		case cl.hidden:
			cl.hide(rf)
		default:
			cl.refuse(rf)
		}
		return h.Refused(rf)
	}
	v, e := h.Act(ctx, cl, g)
	if cl.outlives && e.how == endLater {
		return v
	}
	if e.how == endRefused {
		cl.refuse(e.rf)
		return h.Refused(e.rf)
	}
	cl.end(e)
	return v
}

// decide is the steps before Act: the audit log's room, Ask, then the decision and the
// credential when the call asks policy. A refusal made while the client had already cancelled
// is the cancellation's (CodeCancelled).
func (cl *Call) decide(ctx context.Context, ask func(context.Context, *Call) (Question, *Refusal)) (Grant, *Refusal) {
	g := Grant{cl: cl}
	if rf := cl.auditRefusal(); rf != nil {
		return g, rf
	}
	q, rf := ask(ctx, cl)
	if rf != nil || q.Input == nil {
		return g, rf
	}
	if g.Decision, rf = cl.authorize(ctx, q.Input, q.Admit); rf == nil && !q.Opaque {
		g.Credential, rf = cl.takeCredential(q.Credential, g.Decision.Credential)
	}
	if rf != nil && ctx.Err() != nil {
		rf = cancelled()
	}
	if rf != nil && q.Hidden && rf.Code != CodeCancelled {
		cl.hidden = true
	}
	return g, rf
}

// end ends the call as e says (once: a later end does nothing).
func (cl *Call) end(e End) {
	switch e.how {
	case endAnswered, endLater:
		status := e.status
		if status == 0 {
			status = http.StatusOK
		}
		cl.Answered(status)
		cl.finish()
	case endRefused, endDenied:
		cl.refuse(e.rf)
	case endHidden:
		cl.hide(e.rf)
	case endFailed:
		cl.fail(e.rf)
	case endRecorded:
		cl.finish()
	}
}
