package suggest

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gobwas/glob"

	"github.com/sandgate/sandgate/audit"
)

// Observation is one decided call of the template, as a log recorded it.
type Observation struct {
	ID    string
	Time  time.Time
	Kind  audit.Kind
	Input map[string]any // the policy input (logged, or rebuilt from an audit event)
	// Allowed says the policy allowed the call; a report-only denial (let through, not
	// enforced) is a denial here.
	Allowed bool
	// Code is the decision's code ("" when the log does not say).
	Code string
}

// Evidence is what an entry rests on: how many calls, when, and one of them to look at.
type Evidence struct {
	Count   int       `json:"count"`
	First   time.Time `json:"first"`
	Last    time.Time `json:"last"`
	Example string    `json:"example"` // an audit event's (and decision's) id
	Codes   []string  `json:"codes,omitempty"`
	input   map[string]any
}

func (e *Evidence) add(o *Observation) {
	if e.Count == 0 || o.Time.Before(e.First) {
		e.First = o.Time
	}
	if e.Count == 0 || o.Time.After(e.Last) {
		e.Last = o.Time
	}
	if e.Count == 0 {
		e.Example, e.input = o.ID, o.Input
	}
	e.Count++
	if o.Code != "" && !slices.Contains(e.Codes, o.Code) {
		e.Codes = append(e.Codes, o.Code)
	}
}

// Sections of the template's data an entry belongs to.
const (
	SectionTools     = "tools"
	SectionHosts     = "hosts"
	SectionPorts     = "ports"
	SectionModels    = "models"
	SectionMaxTokens = "max_tokens"
)

// Entry is one change to the template's data: a value added to (or removed from) a section.
type Entry struct {
	Section string `json:"section"`
	// Scope is the upstream (tools), the host (ports) or the provider (models, max_tokens).
	Scope    string   `json:"scope,omitempty"`
	Value    string   `json:"value"`
	Evidence Evidence `json:"evidence"`
	// NoTest says why no test case covers the entry ("" when one does).
	NoTest string `json:"no_test,omitempty"`
}

// String is the entry as the report prints it: "tools everything/add".
func (e Entry) String() string {
	switch e.Section {
	case SectionTools, SectionModels:
		return e.Section + " " + e.Scope + "/" + e.Value
	case SectionPorts:
		return e.Section + " " + e.Scope + ":" + e.Value
	case SectionMaxTokens:
		return e.Section + " " + e.Scope + " " + e.Value
	}
	return e.Section + " " + e.Value
}

func (e Entry) key() string { return e.Section + "\x00" + e.Scope + "\x00" + e.Value }

// Unlifted is a group of denials no data change lifts (or that the change did not lift).
type Unlifted struct {
	Kind     string   `json:"kind"`
	Target   string   `json:"target"`
	Code     string   `json:"code"`
	Why      string   `json:"why"`
	Evidence Evidence `json:"evidence"`
}

// Suggestion is what Suggest found for one template.
type Suggestion struct {
	Template string `json:"template"`
	// Decisions counts the template's decisions read; First and Last bound them.
	Decisions int         `json:"decisions"`
	First     time.Time   `json:"first"`
	Last      time.Time   `json:"last"`
	Add       []Entry     `json:"add"`
	Remove    []Entry     `json:"remove"`
	Unlifted  []*Unlifted `json:"not_data_changes"`
	// Withheld says why the removals were left out ("" when they were not).
	Withheld string `json:"removals_withheld,omitempty"`
	// ReportOnly says the template is in report-only mode (enforce: false).
	ReportOnly bool `json:"report_only"`
	// DataFile is the data file that holds templates[Template], relative to the policy folder;
	// Data its text with the change, Diff the change as a unified diff.
	DataFile string `json:"data_file"`
	Data     string `json:"data"`
	Diff     string `json:"diff"`
	// TestFile is the name of the test file in the folder written with the change; Tests its
	// text: a test case per entry, from the evidence.
	TestFile string `json:"test_file"`
	Tests    string `json:"tests"`

	identity map[string]any // one observed caller's identity, for removal tests
}

// templateData is what the shipped policies read of one template.
type templateData struct {
	Enforce *bool            `json:"enforce"`
	Tools   []toolsEntry     `json:"tools"`
	Hosts   []string         `json:"hosts"`
	Ports   map[string][]int `json:"ports"`
	Models  map[string]model `json:"models"`
}

type toolsEntry struct {
	Upstream    string   `json:"upstream"`
	Allow       []string `json:"allow"`
	GrantScoped []string `json:"grant_scoped"`
}

type model struct {
	Allow     []string `json:"allow"`
	MaxTokens int64    `json:"max_tokens"`
}

type provider struct {
	Hosts []string `json:"hosts"`
}

// analysis gathers what the observations say, before the data is edited.
type analysis struct {
	tmpl      templateData
	providers map[string]provider
	add       map[string]*Entry
	unlifted  map[string]*Unlifted
	used      usage
	s         *Suggestion
}

// usage is what the template's allowed calls used.
type usage struct {
	tools  map[[2]string]bool // upstream, tool
	hosts  map[string]bool
	ports  map[string]map[int]bool
	models map[[2]string]bool // provider, model
}

func newAnalysis(template string, tmpl templateData, providers map[string]provider) *analysis {
	return &analysis{tmpl: tmpl, providers: providers, add: map[string]*Entry{}, unlifted: map[string]*Unlifted{},
		used: usage{tools: map[[2]string]bool{}, hosts: map[string]bool{}, ports: map[string]map[int]bool{}, models: map[[2]string]bool{}},
		s:    &Suggestion{Template: template, ReportOnly: tmpl.Enforce != nil && !*tmpl.Enforce}}
}

// observe takes one decided call of the template.
func (a *analysis) observe(o *Observation) {
	s := a.s
	if s.Decisions == 0 || o.Time.Before(s.First) {
		s.First = o.Time
	}
	if s.Decisions == 0 || o.Time.After(s.Last) {
		s.Last = o.Time
	}
	s.Decisions++
	if s.identity == nil {
		s.identity, _ = o.Input["identity"].(map[string]any)
	}
	f := factsOf(o.Input)
	if o.Allowed {
		a.markUsed(o.Kind, f)
		return
	}
	a.denied(o, f)
}

// facts are the input's parts a suggestion reads.
type facts struct {
	upstream, tool, method, host, route, model string
	port                                       int
	maxTokens                                  int64
}

func factsOf(in map[string]any) facts {
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	num := func(m map[string]any, k string) int64 {
		switch v := m[k].(type) {
		case float64:
			return int64(v)
		case int:
			return int64(v)
		case int64:
			return v
		}
		return -1
	}
	var f facts
	if m, ok := in["mcp"].(map[string]any); ok {
		f.upstream, f.tool = str(m, "upstream"), str(m, "tool")
	}
	if h, ok := in["http"].(map[string]any); ok {
		f.method, f.host, f.route, f.model = str(h, "method"), str(h, "host"), str(h, "route"), str(h, "model")
		f.port, f.maxTokens = int(num(h, "port")), num(h, "max_tokens")
	}
	return f
}

// providerOf is the model provider of a request: its route, else the provider owning the host.
func (a *analysis) providerOf(f facts) string {
	if f.route != "" {
		return f.route
	}
	names := make([]string, 0, len(a.providers))
	for name := range a.providers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if slices.Contains(a.providers[name].Hosts, f.host) {
			return name
		}
	}
	return ""
}

func (a *analysis) markUsed(kind audit.Kind, f facts) {
	switch kind {
	case audit.KindToolsCall, audit.KindPromptsGet, audit.KindResourcesRead:
		a.used.tools[[2]string{f.upstream, f.tool}] = true
	case audit.KindHTTPConnect, audit.KindHTTPRequest:
		if p := a.providerOf(f); p != "" && f.model != "" {
			a.used.models[[2]string{p, f.model}] = true
			return
		}
		a.used.hosts[f.host] = true
		if kind == audit.KindHTTPRequest {
			if a.used.ports[f.host] == nil {
				a.used.ports[f.host] = map[int]bool{}
			}
			a.used.ports[f.host][f.port] = true
		}
	}
}

// denied reads one denial: the entry that lifts it, or why none does.
func (a *analysis) denied(o *Observation, f facts) {
	switch o.Code {
	case "tool_not_allowed":
		a.suggest(o, Entry{Section: SectionTools, Scope: f.upstream, Value: f.tool})
	case "host_not_allowed":
		a.suggest(o, Entry{Section: SectionHosts, Value: f.host})
	case "port_not_allowed":
		a.suggest(o, Entry{Section: SectionPorts, Scope: f.host, Value: strconv.Itoa(f.port)})
		a.used.hosts[f.host] = true // the host the new port is for stays
	case "provider_not_allowed", "model_not_allowed", "max_tokens_exceeded":
		p := a.providerOf(f)
		if p == "" || f.model == "" {
			a.cannot(o, f, "the request names no model of a known provider")
			return
		}
		if o.Code == "max_tokens_exceeded" {
			a.used.models[[2]string{p, f.model}] = true // the model a raised cap is for stays
		} else {
			a.suggest(o, Entry{Section: SectionModels, Scope: p, Value: f.model})
		}
		if f.maxTokens > a.tmpl.Models[p].MaxTokens {
			a.raiseCap(o, p, f.maxTokens)
		}
	default:
		a.cannot(o, f, whyNot(o.Code))
	}
}

func (a *analysis) suggest(o *Observation, e Entry) {
	k := e.key()
	if a.add[k] == nil {
		a.add[k] = &e
	}
	a.add[k].Evidence.add(o)
}

// raiseCap raises the provider's max_tokens entry to the largest request denied over it.
func (a *analysis) raiseCap(o *Observation, p string, n int64) {
	for _, e := range a.add {
		if e.Section == SectionMaxTokens && e.Scope == p {
			if cur, _ := strconv.ParseInt(e.Value, 10, 64); n > cur {
				delete(a.add, e.key())
				e.Value = strconv.FormatInt(n, 10)
				a.add[e.key()] = e
			}
			e.Evidence.add(o)
			return
		}
	}
	a.suggest(o, Entry{Section: SectionMaxTokens, Scope: p, Value: strconv.FormatInt(n, 10)})
}

func (a *analysis) cannot(o *Observation, f facts, why string) {
	target := f.upstream + "/" + f.tool
	if o.Kind == audit.KindHTTPConnect || o.Kind == audit.KindHTTPRequest {
		target = f.method + " " + f.host
		if f.model != "" {
			target += " " + f.model
		}
	}
	k := string(o.Kind) + "\x00" + target + "\x00" + o.Code
	if a.unlifted[k] == nil {
		a.unlifted[k] = &Unlifted{Kind: string(o.Kind), Target: target, Code: o.Code, Why: why}
	}
	a.unlifted[k].Evidence.add(o)
}

// whyNot says why a denial with code is not a change of the template's data.
func whyNot(code string) string {
	switch code {
	case "repo_not_granted":
		return "a grant, not data: the dispatcher registers the repository for the claim (admin API, PUT /v1/grants/{namespace}/claims/{claim}/github_repos)"
	case "not_found":
		return "no upstream offers it: nothing in data makes it exist"
	case "template_unknown":
		return "the template has no entry in the data at all"
	case "model_missing", "max_tokens_missing":
		return "the request itself lacks what the provider requires"
	case "unknown_identity":
		return "an unknown caller: no template's data applies"
	case "":
		return "the log does not say why it was denied"
	}
	return fmt.Sprintf("%q is not a denial a data change lifts (a policy's own rule, or Sandgate's refusal)", code)
}

// removals are the template's entries no allowed call used.
func (a *analysis) removals() []Entry {
	var out []Entry
	for _, te := range a.tmpl.Tools {
		for _, p := range te.Allow {
			g, err := glob.Compile(p, '.')
			used := err != nil // a pattern OPA cannot compile is left alone
			for k := range a.used.tools {
				if used {
					break
				}
				used = k[0] == te.Upstream && g.Match(k[1])
			}
			if !used && a.add[Entry{Section: SectionTools, Scope: te.Upstream, Value: p}.key()] == nil {
				out = append(out, Entry{Section: SectionTools, Scope: te.Upstream, Value: p})
			}
		}
	}
	for _, h := range a.tmpl.Hosts {
		if !a.used.hosts[h] {
			out = append(out, Entry{Section: SectionHosts, Value: h})
		}
	}
	for h, ports := range a.tmpl.Ports {
		used := a.used.ports[h]
		if len(used) == 0 {
			continue // removing the last port would open 80 and 443 (the default), not close one
		}
		for _, p := range ports {
			if !used[p] {
				out = append(out, Entry{Section: SectionPorts, Scope: h, Value: strconv.Itoa(p)})
			}
		}
	}
	for p, m := range a.tmpl.Models {
		for _, name := range m.Allow {
			if !a.used.models[[2]string{p, name}] {
				out = append(out, Entry{Section: SectionModels, Scope: p, Value: name})
			}
		}
	}
	sortEntries(out)
	return out
}

func sortEntries(es []Entry) {
	order := map[string]int{SectionTools: 0, SectionHosts: 1, SectionPorts: 2, SectionModels: 3, SectionMaxTokens: 4}
	slices.SortFunc(es, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(order[a.Section], order[b.Section]), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Value, b.Value))
	})
}

// finish lists what was gathered, in a stable order.
func (a *analysis) finish() *Suggestion {
	s := a.s
	for _, e := range a.add {
		s.Add = append(s.Add, *e)
	}
	sortEntries(s.Add)
	if s.Decisions > 0 {
		s.Remove = a.removals()
	}
	for _, u := range a.unlifted {
		s.Unlifted = append(s.Unlifted, u)
	}
	slices.SortFunc(s.Unlifted, func(x, y *Unlifted) int {
		return cmp.Or(cmp.Compare(y.Evidence.Count, x.Evidence.Count), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Target, y.Target))
	})
	return s
}
