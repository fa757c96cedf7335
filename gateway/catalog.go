package gateway

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// The gateway lists what every upstream declares as the upstream wrote it: each tool
// (inputSchema, outputSchema, annotations, _meta, title, icons and any field a later revision
// adds), resource, resource template and prompt is kept as its raw JSON and written into the
// sandbox's list as it is, renamed only where a prefix applies (lists.go). Nothing of an entry
// is decoded but the field that names it.

// listKind is one list method: the result's array field and the field naming an entry.
type listKind struct {
	method mcp.MCPMethod
	array  string
	key    string
}

var (
	listTools     = listKind{mcp.MethodToolsList, "tools", "name"}
	listPrompts   = listKind{mcp.MethodPromptsList, "prompts", "name"}
	listResources = listKind{mcp.MethodResourcesList, "resources", "uri"}
	listTemplates = listKind{mcp.MethodResourcesTemplatesList, "resourceTemplates", "uriTemplate"}
	listKinds     = [...]listKind{listTools, listPrompts, listResources, listTemplates}
)

// catalog is what one upstream offers.
type catalog struct {
	tools     []rawEntry
	resources []rawEntry
	templates []rawEntry
	prompts   []rawEntry
	// meta is each list result's own _meta (of its first page that has one), without the
	// protocol's keys; ttl is each list result's ttlMs (2026-07-28 upstreams), by list method.
	meta map[mcp.MCPMethod]json.RawMessage
	ttl  map[mcp.MCPMethod]int64
}

// entries is the catalog's list of kind k.
func (c *catalog) entries(k listKind) *[]rawEntry {
	switch k.method {
	case mcp.MethodToolsList:
		return &c.tools
	case mcp.MethodPromptsList:
		return &c.prompts
	case mcp.MethodResourcesList:
		return &c.resources
	}
	return &c.templates
}

// rawEntry is one catalog entry as the upstream wrote it.
type rawEntry struct {
	id  string // its name, URI or URI template
	raw json.RawMessage
}

// listPage is one page of a list result, as far as the gateway reads it.
type listPage struct {
	items []json.RawMessage
	meta  json.RawMessage
	ttl   *int64
	next  string
}

// listAll fetches every page of a list method and returns its entries verbatim, with the
// result's _meta (its first page that has one, without the protocol's own keys, which describe
// the upstream's hop) and ttlMs (the first page's; -1 when it has none).
func listAll(ctx context.Context, cli *client.Client, k listKind) ([]rawEntry, json.RawMessage, int64, error) {
	var out []rawEntry
	var meta json.RawMessage
	ttl := int64(-1)
	seen := map[string]bool{}
	var params any
	for first := true; ; first = false {
		raw, err := rpc(ctx, cli, string(k.method), params)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("%s: %w", k.method, err)
		}
		page, err := readListPage(raw, k)
		if err != nil {
			return nil, nil, 0, err
		}
		if meta == nil && page.meta != nil {
			meta, _ = withoutProtocolMeta(page.meta)
		}
		if first && page.ttl != nil {
			ttl = *page.ttl
		}
		for _, it := range page.items {
			var id string
			if err := jsonscan.Named(it, []string{k.key}, func(_ int, v []byte) error { return json.Unmarshal(v, &id) }); err != nil || id == "" {
				return nil, nil, 0, fmt.Errorf("%s: an entry has no %s", k.method, k.key)
			}
			out = append(out, rawEntry{id: id, raw: it})
		}
		if page.next == "" {
			return out, meta, ttl, nil
		}
		if seen[page.next] {
			return nil, nil, 0, fmt.Errorf("%s: the upstream repeated cursor %q", k.method, page.next)
		}
		seen[page.next] = true
		params = map[string]any{"cursor": page.next}
	}
}

// readListPage reads one page of a list of kind k.
func readListPage(raw json.RawMessage, k listKind) (listPage, error) {
	var p listPage
	var items json.RawMessage
	err := jsonscan.Named(raw, []string{k.array, "_meta", "ttlMs", "nextCursor"}, func(i int, v []byte) error {
		switch i {
		case 0:
			items = v
		case 1:
			if len(v) > 0 && v[0] == '{' {
				p.meta = v
			}
		case 2:
			var n int64
			if json.Unmarshal(v, &n) == nil && n >= 0 {
				p.ttl = &n
			}
		case 3:
			p.next = jsonscan.String(v)
		}
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("%s: result is not an object: %w", k.method, err)
	}
	if len(items) > 0 && string(items) != "null" {
		if err := json.Unmarshal(items, &p.items); err != nil {
			return p, fmt.Errorf("%s: %s is not an array: %w", k.method, k.array, err)
		}
	}
	return p, nil
}

// renamed is raw with its name field set to name (the exposed name); raw itself when the name
// is unchanged. The other members keep their bytes and order.
func renamed(raw json.RawMessage, field, name string) json.RawMessage {
	var old string
	_ = jsonscan.Named(raw, []string{field}, func(_ int, v []byte) error { return json.Unmarshal(v, &old) })
	if old == name {
		return raw
	}
	out, err := jsonenc.WithMember(raw, field, jsonenc.AppendString(nil, name))
	if err != nil {
		return raw
	}
	return out
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}
