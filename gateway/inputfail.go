package gateway

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
)

// A multi round-trip exchange (roundtrip.go) that cannot complete fails the sandbox's call like
// any upstream failure (a tool error result, a JSON-RPC error for resources/read and
// prompts/get), and its audit event says why in outcome.error:
//   - upstream_input_unsupported: an input request of a method Sandgate cannot ask a sandbox
//     for (only elicitation/create, sampling/createMessage and roots/list exist);
//   - upstream_input_unanswered: the sandbox could not be asked, or its client answered an error;
//   - upstream_input_exhausted: the upstream still asked after maxInputRoundTrips round trips
//     (or maxLoadSheddingRuns in a row without an input request).
// The upstream connection stays: the upstream answered, Sandgate could not go on.

// inputError is an exchange that failed on the input asked for; code is the event's outcome.
type inputError struct {
	code string
	err  error
}

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func inputFailed(code, format string, args ...any) error {
	return &inputError{code: code, err: fmt.Errorf(format, args...)}
}

// failureCode is the outcome code of a forwarded call that failed with err.
func failureCode(err error) string {
	var ie *inputError
	if errors.As(err, &ie) {
		return ie.code
	}
	if code := boundCode(err); code != "" {
		return code
	}
	return call.CodeUpstreamError
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
	for id, r := range head.InputRequests {
		var m struct {
			Method mcp.MCPMethod `json:"method"`
		}
		if err := json.Unmarshal(r, &m); err == nil && !inputMethods[m.Method] {
			return ir, inputFailed(call.CodeUpstreamInputUnsupported,
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
