package policy

import (
	"context"
	"fmt"
	"io"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/lineage"
)

// Explain modes, as `opa eval --explain`.
const (
	ExplainNotes = "notes" // only trace(…) notes and the expressions around them
	ExplainFails = "fails" // the expressions that failed
	ExplainFull  = "full"  // every evaluation step
)

// ExplainDocument decides doc like DecideDocument and writes OPA's explanation of the
// evaluation to w, filtered by mode (ExplainNotes, ExplainFails or ExplainFull), in the form
// `opa eval --explain` prints.
func (e *Engine) ExplainDocument(ctx context.Context, doc any, mode string, w io.Writer) (Decision, error) {
	var filter func([]*topdown.Event) []*topdown.Event
	switch mode {
	case ExplainNotes:
		filter = lineage.Notes
	case ExplainFails:
		filter = lineage.Fails
	case ExplainFull:
		filter = lineage.Full
	default:
		return Decision{}, fmt.Errorf("explain mode %q is not one of notes, fails, full", mode)
	}
	rev := e.cur.Load()
	if rev == nil {
		return Decision{Reason: reasonNoPolicy, Code: CodeNoPolicy, Revision: noRevision}, nil
	}
	val, err := ast.InterfaceToValue(doc)
	if err != nil {
		return Decision{}, fmt.Errorf("policy input: %w", err)
	}
	buf := topdown.NewBufferTracer()
	d := rev.decideTraced(ctx, val, buf)
	topdown.PrettyTraceWithLocation(w, filter(*buf))
	return d, nil
}
