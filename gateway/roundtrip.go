package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonenc"
)

// On 2026-07-28 and later an upstream that needs something of the client mid-request
// (elicitation, sampling, roots) answers with a result of resultType "input_required" carrying
// its input requests and an opaque requestState; the client answers them and sends the request
// again with inputResponses and that requestState (SEP-2322, multi round-trip requests).
// Sandgate runs that exchange itself, on rpc, rather than through mcp-go's typed client, so
// that the final result reaches the sandbox as the upstream wrote it (the typed result drops
// what mcp-go does not model: content types and fields of later revisions) and a cancelled
// request is cancelled upstream as on the legacy path.

// Bounds of one exchange, as mcp-go's client has them: round trips in all, and retries in a
// row where the upstream asked for nothing (load shedding).
const (
	maxInputRoundTrips  = 10
	maxLoadSheddingRuns = 3
)

// connHooksKey carries, in a forwarded request's context, the hooks of the connection it is
// sent on: its input requests are answered with them.
type connHooksKey struct{}

func withConnHooks(ctx context.Context, h connHooks) context.Context {
	return context.WithValue(ctx, connHooksKey{}, h)
}

// inputRequired is the part of a result that asks for input; raw holds each input request
// as the upstream wrote it.
type inputRequired struct {
	ResultType    mcp.ResultType    `json:"resultType"`
	InputRequests mcp.InputRequests `json:"inputRequests"`
	RequestState  string            `json:"requestState"`
	raw           map[string]json.RawMessage
}

// roundTrip sends method with params on a 2026-07-28 connection and returns the final result
// verbatim, answering the upstream's input requests with the connection's hooks (which ask
// the sandbox whose call this is) until it stops asking.
func roundTrip(ctx context.Context, cli *client.Client, method string, params any) (json.RawMessage, error) {
	sent, shed := params, 0
	for attempt := 1; ; attempt++ {
		raw, err := rpc(ctx, cli, method, sent)
		if err != nil {
			return nil, err
		}
		if !asksForInput(raw) {
			return raw, nil
		}
		ir, err := decodeInputRequired(method, raw)
		if err != nil {
			return nil, err
		}
		if ir.ResultType != mcp.ResultTypeInputRequired {
			return raw, nil
		}
		if shed = shed + 1; len(ir.InputRequests) > 0 {
			shed = 0
		}
		if attempt >= maxInputRoundTrips || shed >= maxLoadSheddingRuns {
			words := fmt.Sprintf("still asks for input after %d round trips", attempt)
			return nil, inputFailed(call.CodeUpstreamInputExhausted, words, "%s: the upstream %s", method, words)
		}
		answers, err := answerInput(ctx, ir)
		if err != nil {
			return nil, inputFailed(call.CodeUpstreamInputUnanswered, "asked for input the sandbox's client did not give", "%s: %w", method, err)
		}
		if sent, err = withInputResponses(params, answers, ir.RequestState); err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
	}
}

// answerInput asks the sandbox of the call (route.go) each input request, as the upstream wrote
// it, and returns the answers as the sandbox wrote them.
func answerInput(ctx context.Context, ir inputRequired) (map[string]json.RawMessage, error) {
	h, ok := ctx.Value(connHooksKey{}).(connHooks)
	if !ok {
		return nil, errors.New("the upstream asks for input outside a sandbox's call")
	}
	out := make(map[string]json.RawMessage, len(ir.raw))
	for id, raw := range ir.raw {
		in, ok := parseInbound(raw)
		if !ok {
			return nil, fmt.Errorf("input request %q is not a request", id)
		}
		in.call = callOf(ctx)
		r := h.request(ctx, in)
		if r.err != nil {
			var e rpcError
			_ = json.Unmarshal(r.err, &e)
			return nil, fmt.Errorf("input request %q: %s", id, e.Message)
		}
		if in.method == string(mcp.MethodListRoots) {
			r.result = withRoots(r.result)
		}
		out[id] = r.result
	}
	return out, nil
}

// withRoots is a roots/list result with its roots field, which the upstream requires, [] when
// the sandbox's client left it out or null.
func withRoots(res json.RawMessage) json.RawMessage {
	var f struct {
		Roots json.RawMessage `json:"roots"`
	}
	if json.Unmarshal(res, &f) == nil && len(f.Roots) > 0 && string(f.Roots) != "null" {
		return res
	}
	if out, err := jsonenc.WithMember(res, "roots", []byte("[]")); err == nil {
		return out
	}
	return json.RawMessage(`{"roots":[]}`)
}

// withInputResponses is params with the answers and the upstream's request state added.
func withInputResponses(params any, answers map[string]json.RawMessage, state string) (any, error) {
	if p, ok := params.(relayed); ok {
		b, err := json.Marshal(answers)
		if err != nil {
			return nil, fmt.Errorf("encode input responses: %w", err)
		}
		p = p.with("inputResponses", b)
		if state != "" {
			p = p.with("requestState", jsonenc.AppendString(nil, state))
		}
		return p, nil
	}
	fields := map[string]json.RawMessage{}
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("encode params: %w", err)
		}
		if err := json.Unmarshal(b, &fields); err != nil {
			return nil, fmt.Errorf("params are not an object: %w", err)
		}
	}
	var err error
	if fields["inputResponses"], err = json.Marshal(answers); err != nil {
		return nil, fmt.Errorf("encode input responses: %w", err)
	}
	delete(fields, "requestState")
	if state != "" {
		fields["requestState"], _ = json.Marshal(state)
	}
	return fields, nil
}

// inputMethods are the methods an input request may ask for.
var inputMethods = map[mcp.MCPMethod]bool{mcp.MethodElicitationCreate: true, mcp.MethodSamplingCreateMessage: true,
	mcp.MethodListRoots: true}

// decodeInputRequired reads the part of raw, a result of method, that may ask for input. An
// input request of a method no sandbox can be asked for is an inputError naming it.
func decodeInputRequired(method string, raw json.RawMessage) (inputRequired, error) {
	var head struct {
		ResultType    mcp.ResultType             `json:"resultType"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
		RequestState  string                     `json:"requestState"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return inputRequired{}, fmt.Errorf("%s: decode result: %w", method, err)
	}
	ir := inputRequired{ResultType: head.ResultType, RequestState: head.RequestState}
	if ir.ResultType != mcp.ResultTypeInputRequired {
		return ir, nil
	}
	ir.InputRequests = make(mcp.InputRequests, len(head.InputRequests))
	ir.raw = head.InputRequests
	for id, r := range head.InputRequests {
		var m struct {
			Method mcp.MCPMethod `json:"method"`
		}
		if err := json.Unmarshal(r, &m); err == nil && !inputMethods[m.Method] {
			return ir, inputFailed(call.CodeUpstreamInputUnsupported, "an input request asks for a method Sandgate cannot ask a sandbox for "+
				"(only elicitation/create, sampling/createMessage and roots/list can be asked)",
				"%s: the upstream asks for input Sandgate cannot ask a sandbox for: input request %q asks for %q "+
					"(only elicitation/create, sampling/createMessage and roots/list can be asked)", method, id, m.Method)
		}
		var req mcp.InputRequest
		if err := json.Unmarshal(r, &req); err != nil {
			return ir, fmt.Errorf("%s: decode input request %q: %w", method, id, err)
		}
		ir.InputRequests[id] = req
	}
	return ir, nil
}
