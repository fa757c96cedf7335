package call

import (
	"context"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// Run is the one sequence of a call whose steps are all Sandgate's to order: Begin, the check
// that the audit log has room for its event (fail closed), act, and Finish whatever act did.
// act is the only part a half supplies: it notes what it learns, decides (Authorize) when the
// call is one policy decides, and returns its answer, or a refusal, which Run ends the call
// with; refused is the half's answer to a refusal. A call act ended itself (Fail) stays ended.
//
// The connection servers' calls do not go through Run: the gateway's guard begins a call
// before mcp-go runs the method's handler, which ends it, and the proxy's exchange ends with
// ReverseProxy or a tunnel's close (docs/architecture.md, "The one path").
func Run[T any](ctx context.Context, c *Core, kind audit.Kind, id identity.Identity,
	act func(context.Context, *Call) (T, *Refusal), refused func(*Refusal) T) T {
	ctx, cl := c.Begin(ctx, kind, id)
	defer cl.Finish()
	rf := cl.AuditRefusal()
	var v T
	if rf == nil {
		v, rf = act(ctx, cl)
	}
	if rf != nil {
		cl.Refuse(rf)
		return refused(rf)
	}
	return v
}
