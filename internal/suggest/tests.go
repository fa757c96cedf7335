package suggest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/policy"
)

// testFile is the Rego test file of the change: per addition, the call that was denied (as
// logged) is allowed; per removal, a call that would use the entry is denied. An entry whose
// call the candidate does not decide that way gets no test and says why (Entry.NoTest).
func (s *Suggestion) testFile(ctx context.Context, eng *policy.Engine) string {
	var b strings.Builder
	pkg := "sandgate.suggest_" + ident(s.Template) + "_test"
	fmt.Fprintf(&b, "# Tests of the change `sandgate policy suggest --template %s` proposed for templates.%s in %s:\n", s.Template, s.Template, s.DataFile)
	b.WriteString("# each addition allows a call its sandboxes were denied (the call as logged), each removal\n")
	b.WriteString("# denies a call that would use the entry. Keep them with the change.\n")
	fmt.Fprintf(&b, "package %s\n\nimport data.sandgate\n", pkg)
	names := map[string]int{}
	name := func(base string) string {
		base = ident(base)
		names[base]++
		if n := names[base]; n > 1 {
			return base + "_" + strconv.Itoa(n)
		}
		return base
	}
	for i := range s.Add {
		e := &s.Add[i]
		in := e.Evidence.input
		if in == nil || !eng.DecideDocument(ctx, in).Allow {
			e.NoTest = "the change does not allow the logged call"
			continue
		}
		fmt.Fprintf(&b, "\n# + %s: %s\n", e, e.Evidence.Summary("denied"))
		fmt.Fprintf(&b, "test_%s if {\n\td := sandgate.decision with input as %s\n\td.allow\n}\n", name("allows_"+e.String()), rego(in))
	}
	for i := range s.Remove {
		e := &s.Remove[i]
		in, why := s.callUsing(*e)
		if in != nil && eng.DecideDocument(ctx, in).Allow {
			in, why = nil, "another entry still allows a call that uses it"
		}
		if in == nil {
			e.NoTest = why
			continue
		}
		fmt.Fprintf(&b, "\n# - %s: %s\n", e, s.unusedSummary())
		fmt.Fprintf(&b, "test_%s if {\n\td := sandgate.decision with input as %s\n\tnot d.allow\n}\n", name("denies_"+e.String()), rego(in))
	}
	return b.String()
}

// callUsing is a call of the template that would use the entry, for a removal's test; nil and
// why when none can be made up (a glob pattern whose matches cannot be told).
func (s *Suggestion) callUsing(e Entry) (map[string]any, string) {
	id := map[string]any{"namespace": "", "sandbox": "", "template": s.Template, "claim": "", "labels": map[string]any{},
		"source_ip": "", "known": true}
	for k, v := range s.identity {
		id[k] = v
	}
	in := map[string]any{"identity": id, "grants": map[string]any{}, "usage": map[string]any{}}
	switch e.Section {
	case SectionTools:
		if strings.ContainsAny(e.Value, "*?[{\\") {
			return nil, "a pattern: no one tool name stands for it"
		}
		in["kind"] = "mcp.tools_call"
		in["mcp"] = map[string]any{"upstream": e.Scope, "tool": e.Value, "arguments": map[string]any{}}
	case SectionHosts:
		in["kind"] = "http.connect"
		in["http"] = httpInput("CONNECT", e.Value, 443, "", "", -1)
	case SectionPorts:
		port, _ := strconv.Atoi(e.Value)
		in["kind"] = "http.request"
		in["http"] = httpInput("GET", e.Scope, port, "", "", -1)
	case SectionModels:
		in["kind"] = "http.request"
		in["http"] = httpInput("POST", "", 443, e.Scope, e.Value, 1)
	default:
		return nil, "not an entry a call uses"
	}
	return in, ""
}

func httpInput(method, host string, port int, route, model string, maxTokens int) map[string]any {
	return map[string]any{"method": method, "host": host, "port": port, "path": "/", "route": route, "model": model,
		"max_tokens": maxTokens, "stream": false}
}

// Summary is the evidence as one line: "3 denied (tool_not_allowed), 2026-… … 2026-…, e.g. ID".
func (e Evidence) Summary(what string) string {
	codes := ""
	if len(e.Codes) > 0 {
		codes = " (" + strings.Join(e.Codes, ", ") + ")"
	}
	return fmt.Sprintf("%d %s%s, first %s, last %s, e.g. %s", e.Count, what, codes,
		e.First.UTC().Format(time.RFC3339), e.Last.UTC().Format(time.RFC3339), e.Example)
}

// unusedSummary is the evidence of a removal: the window no call used it in.
func (s *Suggestion) unusedSummary() string {
	decisions := "decisions"
	if s.Decisions == 1 {
		decisions = "decision"
	}
	return fmt.Sprintf("no call used it in %d %s of %s, first %s, last %s", s.Decisions, decisions, s.Template,
		s.First.UTC().Format(time.RFC3339), s.Last.UTC().Format(time.RFC3339))
}

// rego writes a decoded JSON document as a Rego term (JSON is one).
func rego(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "{}"
	}
	return strings.TrimSpace(b.String())
}

// ident makes s a Rego identifier: letters, digits and '_'.
func ident(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
