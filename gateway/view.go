package gateway

import (
	"encoding/json"
	"slices"

	"github.com/mark3labs/mcp-go/mcp"
)

// view is the aggregated catalog every sandbox's lists are filtered from: each upstream's
// entries, in the upstreams' config order, under the names sandboxes see. rebuild makes a new
// one whenever an upstream's catalog changes; requests read the current one without a lock.
type view struct {
	lists     [len(listKinds)]viewList
	tools     map[string]named
	prompts   map[string]named
	resources map[string]*upstream // URI → the upstream serving it
	templates []templateEntry
}

// viewList is one list of the view.
type viewList struct {
	entries []viewEntry
	metas   []json.RawMessage // each upstream's list result _meta, by upstream index (nil: none)
	ttls    []int64           // each upstream's list result ttlMs, by upstream index (-1: none)
}

// viewEntry is one entry of a list as sandboxes see it.
type viewEntry struct {
	id   string          // the exposed name, URI or URI template
	raw  json.RawMessage // the upstream's entry, renamed where a prefix applies
	up   *upstream
	from int    // the upstream's index
	name string // the upstream's own name, URI or URI template
}

// templateEntry is a resource template and the upstream serving it.
type templateEntry struct {
	tmpl     mcp.ResourceTemplate
	upstream *upstream
}

// list is the view's list of kind k.
func (v *view) list(k listKind) *viewList {
	return &v.lists[slices.Index(listKinds[:], k)]
}

// rebuild recomputes the view from every upstream's catalog and installs it, then tells each
// sandbox whose visible lists changed (listchanged.go).
func (g *Gateway) rebuild() {
	g.rebuildMu.Lock()
	defer g.rebuildMu.Unlock()
	v := &view{tools: map[string]named{}, prompts: map[string]named{}, resources: map[string]*upstream{}}
	shown := g.pinFilter()
	var toolC, promptC []candidate
	defs := map[candidate]json.RawMessage{}
	for i, u := range g.upstreams {
		// A down upstream keeps the catalog it last listed (empty if it never was): its tools stay
		// visible to whom policy shows them and answer upstream_unavailable meanwhile.
		cat := u.catalog()
		for j, k := range listKinds {
			l := &v.lists[j]
			l.metas = append(l.metas, cat.meta[k.method])
			ttl, ok := cat.ttl[k.method]
			if !ok {
				ttl = -1
			}
			l.ttls = append(l.ttls, ttl)
		}
		for _, t := range cat.tools {
			if !shown(u, t.id, t.raw) {
				continue // a changed definition is no tool until it is pinned again
			}
			c := candidate{u, t.id}
			toolC = append(toolC, c)
			defs[c] = t.raw
		}
		for _, p := range cat.prompts {
			c := candidate{u, p.id}
			promptC = append(promptC, c)
			defs[c] = p.raw
		}
		for _, r := range cat.resources {
			if _, dup := v.resources[r.id]; dup {
				g.log.Warn("resource offered by two upstreams; the earlier one serves it", "uri", r.id, "upstream", u.cfg.Name)
				continue
			}
			v.resources[r.id] = u
			v.list(listResources).add(viewEntry{id: r.id, raw: r.raw, up: u, from: i, name: r.id})
		}
		for _, t := range cat.templates {
			var tmpl mcp.ResourceTemplate
			if json.Unmarshal(t.raw, &tmpl) != nil || tmpl.URITemplate == nil {
				g.log.Warn("resource template not understood; not offered", "uri_template", t.id, "upstream", u.cfg.Name)
				continue
			}
			v.templates = append(v.templates, templateEntry{tmpl, u})
			v.list(listTemplates).add(viewEntry{id: t.id, raw: t.raw, up: u, from: i, name: t.id})
		}
	}
	index := func(u *upstream) int { return slices.Index(g.upstreams, u) }
	for _, n := range assignNames(toolC, func(name string, cs []candidate) { g.clash("tool", name, cs) }) {
		raw := renamed(defs[candidate{n.upstream, n.name}], "name", n.exposed)
		n.raw = raw
		v.tools[n.exposed] = n
		v.list(listTools).add(viewEntry{id: n.exposed, raw: raw, up: n.upstream, from: index(n.upstream), name: n.name})
	}
	for _, n := range assignNames(promptC, func(name string, cs []candidate) { g.clash("prompt", name, cs) }) {
		v.prompts[n.exposed] = n
		raw := renamed(defs[candidate{n.upstream, n.name}], "name", n.exposed)
		v.list(listPrompts).add(viewEntry{id: n.exposed, raw: raw, up: n.upstream, from: index(n.upstream), name: n.name})
	}
	g.view.Store(v)
	g.tellListChanges()
}

func (l *viewList) add(e viewEntry) { l.entries = append(l.entries, e) }

func (g *Gateway) tool(name string) (named, bool) {
	n, ok := g.view.Load().tools[name]
	return n, ok
}

func (g *Gateway) prompt(name string) (named, bool) {
	n, ok := g.view.Load().prompts[name]
	return n, ok
}

// resourceUpstream finds the upstream serving uri: an exact resource, else the first upstream
// with a template that matches.
func (g *Gateway) resourceUpstream(uri string) (*upstream, bool) {
	v := g.view.Load()
	if u, ok := v.resources[uri]; ok {
		return u, true
	}
	for _, t := range v.templates {
		if t.tmpl.URITemplate.Regexp().MatchString(uri) {
			return t.upstream, true
		}
	}
	return nil, false
}

// templateUpstream is the upstream whose resource template is raw, or nil.
func (g *Gateway) templateUpstream(raw string) *upstream {
	for _, t := range g.view.Load().templates {
		if t.tmpl.URITemplate.Raw() == raw {
			return t.upstream
		}
	}
	return nil
}
