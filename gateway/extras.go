package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/sse"
)

// A result's top-level fields that mcp-go's typed results have no place for (a field a later
// revision adds, an upstream's own extension, a resources/read result's _meta) reach the sandbox
// too: the handler that forwarded the request keeps them (keepExtras) and the guard's writer adds
// them to the response to that request as mcp-go writes it (responseWriter). A field the typed
// result already wrote is never replaced. The event store records an SSE response with them
// (storedWithExtras), so that a replay after a Last-Event-ID sends the bytes the live stream sent.

// typedFields are, per method, the top-level result fields the sandbox's result already carries
// (or that belong to the upstream hop only: resultType and the multi round-trip fields).
var typedFields = map[string][]string{
	string(mcp.MethodToolsCall):          {"content", "structuredContent", "isError", "_meta"},
	string(mcp.MethodResourcesRead):      {"contents"},
	string(mcp.MethodPromptsGet):         {"description", "messages", "_meta"},
	string(mcp.MethodCompletionComplete): {"completion", "_meta"},
}

// wholeResults are the methods whose results are kept whole (keptWhole, toolResultFor) rather
// than field by field: a completion's typed form drops hasMore: false (omitempty).
var wholeResults = []string{string(mcp.MethodToolsCall), string(mcp.MethodCompletionComplete)}

var hopFields = []string{"resultType", "inputRequests", "requestState"}

// resultExtras carries the extra fields of one request's result from its handler to the writer
// of its response.
type resultExtras struct {
	id     json.RawMessage // of the request
	mu     sync.Mutex
	fields map[string]json.RawMessage
	result *verbatimResult // a result kept whole (rawresult.go)
}

type extrasKey struct{}

func (e *resultExtras) get() (map[string]json.RawMessage, *verbatimResult) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fields, e.result
}

// complete is msg, mcp-go's response to the request, with what the handler kept of the result;
// errNotAList when msg is another message or nothing was kept.
func (e *resultExtras) complete(msg []byte) ([]byte, error) {
	fields, result := e.get()
	switch {
	case result != nil:
		return withVerbatimResult(msg, e.id, result)
	case len(fields) > 0:
		return addExtras(msg, e.id, fields)
	}
	return nil, errNotAList
}

// keepExtras records the top-level fields of raw, the result of method, that the sandbox's
// typed result does not carry, for the request in ctx (when its writer adds them).
func keepExtras(ctx context.Context, method string, raw json.RawMessage) {
	e, ok := ctx.Value(extrasKey{}).(*resultExtras)
	known, forwarded := typedFields[method]
	if !ok || !forwarded || slices.Contains(wholeResults, method) {
		return
	}
	fields, err := extraFields(raw, known)
	if err != nil {
		return
	}
	e.mu.Lock()
	e.fields = fields
	e.mu.Unlock()
}

// withExtras prepares the response to a request of method with ID id to carry its result's
// extra fields (nil for a method whose results have none to keep), which the response's writer
// adds (responseWriter).
func withExtras(ctx context.Context, method string, id json.RawMessage) (context.Context, *resultExtras) {
	if _, ok := typedFields[method]; !ok || len(id) == 0 {
		return ctx, nil
	}
	e := &resultExtras{id: id}
	return context.WithValue(ctx, extrasKey{}, e), e
}

// kept reports whether the handler kept anything of the result.
func (e *resultExtras) kept() bool {
	if e == nil {
		return false
	}
	fields, result := e.get()
	return len(fields) > 0 || result != nil
}

// addExtras adds fields to the result of msg when msg is the response to request id.
func addExtras(msg []byte, id json.RawMessage, fields map[string]json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(msg, &m); err != nil || m["result"] == nil || !sameID(m["id"], id) {
		return nil, errNotAList
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(m["result"], &res); err != nil {
		return nil, err
	}
	for k, v := range fields {
		if _, ok := res[k]; !ok {
			res[k] = v
		}
	}
	var err error
	if m["result"], err = json.Marshal(res); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// rewriteMessages applies f to each JSON-RPC message of body: a JSON response, or the data of
// each event of an SSE stream. A message f fails on is left as it is.
func rewriteMessages(body []byte, contentType string, f func([]byte) ([]byte, error)) []byte {
	if strings.HasPrefix(contentType, "text/event-stream") {
		return rewriteEvents(body, func(ev sse.Event) ([]byte, bool) {
			out, err := f(ev.Data)
			return out, err == nil
		})
	}
	out, err := f(bytes.TrimSpace(body))
	if err != nil {
		return body
	}
	return append(out, '\n')
}
