package policy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/sandgate/sandgate/audit"
)

// Replaying the audit log. An audit event holds most of its call's input (identity, kind,
// upstream and tool, method, host, port, path, route, model) but not all of it: no tool-call
// arguments (only their hash), no grants, no usage, and no max_tokens or stream of a model
// request. The input is rebuilt from what the event holds; what it lacks is absent, and each
// evaluation is traced: a policy that reads a part the event lacks cannot be replayed on it,
// and the replay stops with an error that names the part and the event. Nor does an event
// say which code an allowed call got, so both the candidate and a baseline policy (the serving
// folder) decide every rebuilt input and the replay reports where they differ.

// ReplayAudit replays the audit log in dir: every event of a kind policy decides one call at a
// time (mcp.tools_call, mcp.prompts_get, mcp.resources_read, http.connect, http.request) is
// decided under baseline and under e, and the report counts where they differ.
func ReplayAudit(ctx context.Context, e, baseline *Engine, dir string, opts ReplayOptions) (*ReplayReport, error) {
	r, err := replay(ctx, e, auditSource{dir: dir, baseline: baseline}, opts)
	if err != nil {
		return nil, err
	}
	r.Source, r.Baseline = SourceAuditLog, baseline.Revision()
	return r, nil
}

type auditSource struct {
	dir      string
	baseline *Engine
}

func (s auditSource) read(ctx context.Context, out chan<- replayBatch) error {
	b := &batcher{out: out}
	_, err := audit.Scan(ctx, s.dir, audit.Filter{}, func(ev *audit.Event) error {
		if !replayableKinds[ev.Kind] {
			return nil
		}
		c := *ev
		return b.add(ctx, &c)
	})
	if err != nil {
		return err
	}
	b.flush()
	return nil
}

func (s auditSource) decode(ctx context.Context, item any, _ int) (*pastDecision, error) {
	ev := item.(*audit.Event)
	doc, missing := InputFromEvent(ev)
	p := &pastDecision{id: ev.ID, at: ev.Time, input: doc, missing: missing, facts: factsOf(doc)}
	d, read := s.baseline.decideReading(ctx, doc, missing)
	if len(read) > 0 {
		return nil, missingInputError(p, read, s.baseline.Revision())
	}
	p.logged = outcomeOf(d)
	return p, nil
}

// replayableKinds are the kinds whose event is one decided call.
var replayableKinds = map[audit.Kind]bool{
	audit.KindToolsCall: true, audit.KindPromptsGet: true, audit.KindResourcesRead: true,
	audit.KindHTTPConnect: true, audit.KindHTTPRequest: true,
}

// InputFromEvent rebuilds the policy input of an audited call from what its event holds, and
// lists the input paths (keys from input's root) the event does not hold.
func InputFromEvent(ev *audit.Event) (map[string]any, [][]string) {
	id := &ev.Identity
	labels := make(map[string]any, len(id.Labels))
	for k, v := range id.Labels {
		labels[k] = v
	}
	doc := map[string]any{
		"kind": string(ev.Kind),
		"identity": map[string]any{"namespace": id.Namespace, "sandbox": id.Sandbox, "template": id.Template,
			"claim": id.Claim, "labels": labels, "source_ip": id.SourceIP, "known": id.Known},
	}
	missing := [][]string{{"grants"}, {"usage"}}
	t := &ev.Target
	switch ev.Kind {
	case audit.KindToolsCall, audit.KindPromptsGet, audit.KindResourcesRead:
		m := map[string]any{"upstream": t.Upstream, "tool": t.Tool}
		if ev.Kind == audit.KindResourcesRead {
			m["arguments"] = map[string]any{} // a read has none
		} else {
			missing = append(missing, []string{"mcp", "arguments"})
		}
		doc["mcp"] = m
	case audit.KindHTTPConnect, audit.KindHTTPRequest:
		h := map[string]any{"method": t.Method, "path": t.Path, "route": t.Route, "model": t.Model,
			"max_tokens": -1, "stream": false}
		if ev.Kind == audit.KindHTTPConnect {
			h["method"], h["path"], h["route"], h["model"] = "CONNECT", "", "", ""
		}
		host, port, known := hostPort(t.Host, ev.Kind, t.Route)
		h["host"] = host
		if known {
			h["port"] = port
		} else {
			missing = append(missing, []string{"http", "port"})
		}
		if t.Model != "" {
			// A model request: the event names the model, not max_tokens nor stream.
			delete(h, "max_tokens")
			delete(h, "stream")
			missing = append(missing, []string{"http", "max_tokens"}, []string{"http", "stream"})
		}
		doc["http"] = h
	}
	return doc, missing
}

// hostPort splits an event's host, written without its port when the port is its scheme's
// default: a CONNECT's is 443 and a route's upstream is https; a plain request's default is 80
// and an intercepted one's 443, which the event does not tell apart.
func hostPort(h string, kind audit.Kind, route string) (string, int, bool) {
	if host, p, err := net.SplitHostPort(h); err == nil {
		if n, err := strconv.Atoi(p); err == nil {
			return host, n, true
		}
	}
	if kind == audit.KindHTTPConnect || route != "" {
		return h, 443, true
	}
	return h, 0, false
}

func missingInputError(p *pastDecision, read []string, revision string) error {
	return fmt.Errorf("audit event %s (%s %s of %s/%s): the policy (revision %s) reads %s, which audit events do not hold; "+
		"replay the decision log instead (policy replay --from var/decisions/decisions.log, or --config with policy.decision_log.file)",
		p.id, p.facts.kind, p.facts.target, p.facts.namespace, p.facts.sandbox, revision, strings.Join(read, ", "))
}

// decideReading decides doc and reports which of the missing input paths the evaluation read
// (as input.a.b, sorted), by tracing it: any expression that refers to a missing path, or to a
// part of input above one, counts.
func (e *Engine) decideReading(ctx context.Context, doc any, missing [][]string) (Decision, []string) {
	rev := e.cur.Load()
	if rev == nil {
		return Decision{Reason: reasonNoPolicy, Code: CodeNoPolicy, Revision: noRevision}, nil
	}
	val, err := ast.InterfaceToValue(doc)
	if err != nil {
		return Decision{Reason: "policy input: " + err.Error(), Code: CodeInputError, Revision: rev.id, Err: err}, nil
	}
	t := &inputReads{missing: missing, read: map[string]bool{}, compiler: rev.compiler}
	d := rev.decideTraced(ctx, val, t)
	read := make([]string, 0, len(t.read))
	for p := range t.read {
		read = append(read, p)
	}
	slices.Sort(read)
	return d, read
}

// inputReads is a tracer noting which of the missing input paths an evaluation refers to. OPA's
// rule index reads input without an evaluation event (a rule whose body compares an absent part
// of input is skipped unseen), so the rules an index lookup considers count as read whole.
type inputReads struct {
	missing  [][]string
	read     map[string]bool
	compiler *ast.Compiler
}

func (t *inputReads) Enabled() bool               { return true }
func (t *inputReads) Config() topdown.TraceConfig { return topdown.TraceConfig{} }

func (t *inputReads) TraceEvent(ev topdown.Event) {
	switch ev.Op {
	case topdown.EvalOp:
		if expr, ok := ev.Node.(*ast.Expr); ok {
			t.refs(expr)
		}
	case topdown.IndexOp:
		if ev.Ref == nil || t.compiler == nil {
			return
		}
		for _, rule := range t.compiler.GetRulesForVirtualDocument(*ev.Ref) {
			for r := rule; r != nil; r = r.Else {
				t.refs(r.Body)
			}
		}
	}
}

func (t *inputReads) refs(x any) {
	ast.WalkRefs(x, func(r ast.Ref) bool {
		if !r[0].Equal(ast.InputRootDocument) {
			return false
		}
		for _, p := range t.missing {
			if overlaps(r[1:], p) {
				t.read["input."+strings.Join(p, ".")] = true
			}
		}
		return false
	})
}

// overlaps reports whether a reference into input (its keys after input) reaches path or a part
// of it: one is a prefix of the other, a key that is not a constant string matching any.
func overlaps(ref ast.Ref, path []string) bool {
	for i := 0; i < len(ref) && i < len(path); i++ {
		s, ok := ref[i].Value.(ast.String)
		if ok && string(s) != path[i] {
			return false
		}
	}
	return true
}
