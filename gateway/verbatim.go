package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
)

// The gateway passes every object an upstream declares through verbatim: tools (inputSchema,
// outputSchema, annotations, _meta, title, icons and any field a later revision adds),
// resources, resource templates and prompts reach the sandbox byte for byte as JSON values,
// except the name when a prefix applies. mcp-go's typed structures model only part of them
// (a typed input schema loses $schema, allOf, if/then/else and gains "required": []), so the
// catalog keeps each entry's raw JSON next to its typed form, and the list responses mcp-go
// writes (already filtered by policy) get each entry replaced by its raw form (splice).

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
	listKinds     = map[string]listKind{string(listTools.method): listTools, string(listPrompts.method): listPrompts,
		string(listResources.method): listResources, string(listTemplates.method): listTemplates}
)

// rawEntry is one catalog entry as the upstream wrote it.
type rawEntry struct {
	id  string // its name, URI or URI template
	raw json.RawMessage
}

// listAll fetches every page of a list method and returns its entries verbatim, and the _meta
// of the result's first page that has one, without the protocol's own keys (which describe the
// upstream's hop), nil when none has.
func listAll(ctx context.Context, cli *client.Client, k listKind) ([]rawEntry, json.RawMessage, error) {
	var out []rawEntry
	var meta json.RawMessage
	seen := map[string]bool{}
	var params any
	for {
		var page map[string]json.RawMessage
		if err := rpcInto(ctx, cli, string(k.method), params, &page); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", k.method, err)
		}
		var items []json.RawMessage
		if err := json.Unmarshal(orNull(page[k.array]), &items); err != nil {
			return nil, nil, fmt.Errorf("%s: %s is not an array: %w", k.method, k.array, err)
		}
		if m := page["_meta"]; meta == nil && len(m) > 0 && m[0] == '{' {
			meta, _ = withoutProtocolMeta(m)
		}
		for _, it := range items {
			var fields map[string]json.RawMessage
			var id string
			if err := json.Unmarshal(it, &fields); err != nil || json.Unmarshal(orNull(fields[k.key]), &id) != nil || id == "" {
				return nil, nil, fmt.Errorf("%s: an entry has no %s", k.method, k.key)
			}
			out = append(out, rawEntry{id: id, raw: it})
		}
		var next string
		_ = json.Unmarshal(orNull(page["nextCursor"]), &next)
		if next == "" {
			return out, meta, nil
		}
		if seen[next] {
			return nil, nil, fmt.Errorf("%s: the upstream repeated cursor %q", k.method, next)
		}
		seen[next] = true
		params = map[string]any{"cursor": next}
	}
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// typedTool is the mcp-go form of a raw tool. Its schemas stay raw, so that mcp-go neither
// rewrites them nor validates against a lossy copy.
func typedTool(e rawEntry) (mcp.Tool, error) {
	var t mcp.Tool
	if err := json.Unmarshal(e.raw, &t); err != nil {
		return t, fmt.Errorf("tool %q: %w", e.id, err)
	}
	var f struct {
		In  json.RawMessage `json:"inputSchema"`
		Out json.RawMessage `json:"outputSchema"`
	}
	_ = json.Unmarshal(e.raw, &f)
	t.InputSchema, t.RawInputSchema = mcp.ToolInputSchema{}, f.In
	if len(f.In) == 0 {
		t.RawInputSchema = json.RawMessage(`{"type":"object"}`)
	}
	t.OutputSchema, t.RawOutputSchema = mcp.ToolOutputSchema{}, f.Out
	return t, nil
}

// renamed is raw with its name field set to name (the exposed name); raw itself when the name
// is unchanged.
func renamed(raw json.RawMessage, field, name string) json.RawMessage {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return raw
	}
	var old string
	if json.Unmarshal(orNull(fields[field]), &old) == nil && old == name {
		return raw
	}
	fields[field], _ = json.Marshal(name)
	out, err := json.Marshal(fields)
	if err != nil {
		return raw
	}
	return out
}

// splice replaces each entry of a list result in body (a JSON-RPC response, or an SSE stream
// carrying it) by its verbatim form from raw, keyed by the entry's name, URI or URI template,
// and puts the entries back in the upstreams' order (mcp-go sorts them by name). An entry raw
// does not know is left as mcp-go wrote it, after the others.
func splice(body []byte, contentType string, k listKind, raw verbatimList) []byte {
	return rewriteMessages(body, contentType, func(msg []byte) ([]byte, error) { return spliceMessage(msg, k, raw) })
}

// errNotAList is a message that is not the result being rewritten.
var errNotAList = errors.New("not the result rewritten")

func spliceMessage(msg []byte, k listKind, raw verbatimList) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(msg, &m); err != nil || m["result"] == nil {
		return nil, errNotAList
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(m["result"], &res); err != nil || res[k.array] == nil {
		return nil, errNotAList
	}
	var items []json.RawMessage
	if err := json.Unmarshal(res[k.array], &items); err != nil {
		return nil, err
	}
	pos := make(map[int]int, len(items))
	var known []string // the IDs of the entries raw knows
	for i, it := range items {
		var f map[string]json.RawMessage
		var id string
		pos[i] = len(raw.order) + i
		if json.Unmarshal(it, &f) == nil && json.Unmarshal(orNull(f[k.key]), &id) == nil {
			if r, ok := raw.entries[id]; ok {
				items[i], pos[i] = r, raw.order[id]
				known = append(known, id)
			}
		}
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return pos[idx[a]] < pos[idx[b]] })
	sorted := make([]json.RawMessage, len(items))
	for i, j := range idx {
		sorted[i] = items[j]
	}
	items = sorted
	var err error
	if res[k.array], err = json.Marshal(items); err != nil {
		return nil, err
	}
	if meta := raw.metaOf(known); meta != nil && res["_meta"] == nil {
		res["_meta"] = meta
	}
	if m["result"], err = json.Marshal(res); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// rawContent is one content item of a result as the upstream wrote it: text, image, a content
// type no revision defines yet, with its annotations and _meta. It embeds TextContent only to be
// an mcp.Content (whose method is unexported), and marshals as the raw item.
type rawContent struct {
	mcp.TextContent
	raw json.RawMessage
}

func (c rawContent) MarshalJSON() ([]byte, error) { return c.raw, nil }

// parseToolResult decodes a tools/call result keeping its content items and structuredContent
// verbatim (mcp-go's typed content drops what it does not model and refuses unknown types).
func parseToolResult(raw *json.RawMessage) (*mcp.CallToolResult, error) {
	f, ok := scanToolResult(*raw)
	if !ok {
		f = toolResultFields{}
		if err := json.Unmarshal(*raw, &f); err != nil {
			return nil, fmt.Errorf("decode tools/call result: %w", err)
		}
	}
	if f.Content == nil {
		return nil, errors.New("tools/call result has no content")
	}
	res := &mcp.CallToolResult{IsError: f.IsError, RawStructuredContent: f.Structured}
	res.Meta = f.Meta
	res.Content = make([]mcp.Content, 0, len(f.Content))
	for _, c := range f.Content {
		res.Content = append(res.Content, rawContent{raw: c})
	}
	return res, nil
}

// toolResultFields are the fields of a tools/call result the sandbox's typed result carries.
type toolResultFields struct {
	Meta       *mcp.Meta         `json:"_meta"`
	Content    []json.RawMessage `json:"content"`
	Structured json.RawMessage   `json:"structuredContent"`
	IsError    bool              `json:"isError"`
}

// rawResourceContents is one entry of a resources/read result as the upstream wrote it.
type rawResourceContents struct {
	mcp.TextResourceContents
	raw json.RawMessage
}

func (c rawResourceContents) MarshalJSON() ([]byte, error) { return c.raw, nil }

// parseReadResult decodes a resources/read result keeping each entry of contents verbatim.
func parseReadResult(raw *json.RawMessage) (*mcp.ReadResourceResult, error) {
	var f struct {
		Contents []json.RawMessage `json:"contents"`
	}
	if err := json.Unmarshal(*raw, &f); err != nil {
		return nil, fmt.Errorf("decode resources/read result: %w", err)
	}
	res := &mcp.ReadResourceResult{Contents: make([]mcp.ResourceContents, 0, len(f.Contents))}
	for _, c := range f.Contents {
		var uri struct {
			URI string `json:"uri"`
		}
		_ = json.Unmarshal(c, &uri)
		res.Contents = append(res.Contents, rawResourceContents{mcp.TextResourceContents{URI: uri.URI}, c})
	}
	return res, nil
}

// parsePromptResult decodes a prompts/get result keeping each message's content verbatim.
func parsePromptResult(raw *json.RawMessage) (*mcp.GetPromptResult, error) {
	var f struct {
		Meta        *mcp.Meta `json:"_meta"`
		Description string    `json:"description"`
		Messages    []struct {
			Role    mcp.Role        `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(*raw, &f); err != nil {
		return nil, fmt.Errorf("decode prompts/get result: %w", err)
	}
	res := &mcp.GetPromptResult{Description: f.Description, Messages: make([]mcp.PromptMessage, 0, len(f.Messages))}
	res.Meta = f.Meta
	for _, m := range f.Messages {
		res.Messages = append(res.Messages, mcp.PromptMessage{Role: m.Role, Content: rawContent{raw: m.Content}})
	}
	return res, nil
}

// bufferedWriter holds a list response until it is spliced.
type bufferedWriter struct {
	header http.Header
	code   int
	buf    bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }
func (b *bufferedWriter) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}
func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.buf.Write(p)
}
func (b *bufferedWriter) Flush() {}

// serveVerbatim serves a list request through next and writes its response with the entries
// spliced in verbatim.
func (g *Gateway) serveVerbatim(w http.ResponseWriter, r *http.Request, next http.Handler, k listKind) {
	bw := &bufferedWriter{header: w.Header()}
	next.ServeHTTP(bw, r)
	body := bw.buf.Bytes()
	if bw.code == http.StatusOK {
		ct := w.Header().Get("Content-Type")
		body = splice(body, ct, k, g.rawEntries(k))
		w.Header().Del("Content-Length")
		// A client that accepts a stream gets one, as from SDKs that always stream (the Go SDK):
		// one event carrying the response.
		if strings.HasPrefix(ct, "application/json") && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			body = append(append([]byte("event: message\ndata: "), bytes.TrimSpace(body)...), "\n\n"...)
		}
	}
	if bw.code != 0 {
		w.WriteHeader(bw.code)
	}
	_, _ = w.Write(body)
}

// verbatimList is one list's entries as the upstreams wrote them, by the ID the sandbox sees,
// and their position in the upstreams' order; and each upstream's list result's own _meta, and
// which upstream each entry is from.
type verbatimList struct {
	entries map[string]json.RawMessage
	order   map[string]int
	metas   []json.RawMessage // by upstream, in the upstreams' order (nil: none)
	from    map[string]int    // entry ID → its upstream's index in metas
}

func newVerbatimList() *verbatimList {
	return &verbatimList{entries: map[string]json.RawMessage{}, order: map[string]int{}, from: map[string]int{}}
}

// add records an entry of upstream from (its index in metas).
func (l *verbatimList) add(id string, raw json.RawMessage, from int) {
	if _, dup := l.entries[id]; dup {
		return
	}
	l.entries[id] = raw
	l.order[id] = len(l.order)
	l.from[id] = from
}

// upstream records the next upstream's list result's _meta; its index is the upstream's.
func (l *verbatimList) upstream(meta json.RawMessage) { l.metas = append(l.metas, meta) }

// metaOf is the _meta of a list response holding the entries ids: the _meta of the list result
// of each upstream with an entry among them, merged in the upstreams' order (the first upstream
// to set a key wins); nil when there is none. A sandbox that sees none of an upstream's entries
// sees nothing of its list's _meta.
func (l verbatimList) metaOf(ids []string) json.RawMessage {
	if len(l.metas) == 0 {
		return nil
	}
	shown := make([]bool, len(l.metas))
	for _, id := range ids {
		if i, ok := l.from[id]; ok && i < len(shown) {
			shown[i] = true
		}
	}
	merged := map[string]json.RawMessage{}
	for i, meta := range l.metas {
		var m map[string]json.RawMessage
		if !shown[i] || json.Unmarshal(orNull(meta), &m) != nil {
			continue
		}
		for key, v := range m {
			if _, set := merged[key]; !set {
				merged[key] = v
			}
		}
	}
	if len(merged) == 0 {
		return nil
	}
	out, err := json.Marshal(merged)
	if err != nil {
		return nil
	}
	return out
}

// rawEntries is the verbatim form of every entry of one list.
func (g *Gateway) rawEntries(k listKind) verbatimList {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if l := g.raw[k.method]; l != nil {
		return *l
	}
	return verbatimList{}
}
