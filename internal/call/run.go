package call

import (
	"context"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
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

// Run is the one sequence of every call: Begin, the check that the audit log has room for its
// event (fail closed: nothing else is answered), act, and Finish whatever act did. act is the
// only part a half supplies: it notes what it learns, decides (Authorize: admission, then
// policy) when the call is one policy decides, does what was asked, and returns its answer or a
// refusal, which Run ends the call with before refused answers it. A call act ended itself
// (Fail, or Finish after an answer it wrote) stays ended; a call act handed on (Outlive: a
// tunnel that outlives its CONNECT) is left open for what carries it to finish.
//
// Outside internal/call nothing else begins a call (test/layout enforces it), except the
// gateway's handlers run in-process without a connection server (gateway/authorize.go,
// callFrom).
func Run[T any](ctx context.Context, c *Core, s Spec, act func(context.Context, *Call) (T, *Refusal), refused func(*Refusal) T) T {
	ctx, cl := c.Begin(ctx, s.Kind, s.Identity)
	defer func() {
		if !cl.outlives {
			cl.Finish()
		}
	}()
	if s.Span != "" {
		cl.span.SetName(s.Span)
	}
	cl.Describe(s.Target)
	cl.BytesIn.Store(s.BytesIn)
	rf := cl.AuditRefusal()
	var v T
	if rf == nil {
		v, rf = act(ctx, cl)
	}
	if rf != nil {
		cl.outlives = false
		cl.Refuse(rf)
		return refused(rf)
	}
	return v
}

// Outlive hands the call's end to what carries on after Run returns (a relayed or intercepted
// tunnel, whose close finishes it): Run then leaves it open. Only act calls it, on Run's
// goroutine.
func (cl *Call) Outlive() { cl.outlives = true }
