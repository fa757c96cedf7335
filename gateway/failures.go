package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
)

// What the gateway says of a failure is its own words from a closed set, never an upstream's
// bytes (an error text of the transport can quote a malformed header or line the upstream
// chose): the text names the upstream and the code, and the call's event carries the code. An
// error the upstream answered is another thing: its JSON-RPC error object is relayed to the
// sandbox as written, through the response guard (forward.go).

// replyError is a JSON-RPC error an upstream answered to a request.
type replyError struct {
	raw     json.RawMessage // the error object, as the upstream's fields say it
	details *mcp.JSONRPCErrorDetails
}

func newReplyError(d *mcp.JSONRPCErrorDetails) *replyError {
	raw, err := json.Marshal(d)
	if err != nil {
		raw, _ = json.Marshal(mcp.JSONRPCErrorDetails{Code: d.Code, Message: d.Message})
	}
	return &replyError{raw: raw, details: d}
}

func (e *replyError) Error() string { return e.details.Message }

// Unwrap is the error mcp-go makes of it (its sentinel errors: an unsupported protocol
// version, a method not found …).
func (e *replyError) Unwrap() error { return e.details.AsError() }

// An input exchange (roundtrip.go) that cannot complete fails the call with its own code:
//   - upstream_input_unsupported: an input request of a method Sandgate cannot ask a sandbox
//     for (only elicitation/create, sampling/createMessage and roots/list exist);
//   - upstream_input_unanswered: the sandbox could not be asked, or its client answered an error;
//   - upstream_input_exhausted: the upstream still asked after maxInputRoundTrips round trips
//     (or maxLoadSheddingRuns in a row without an input request).
// The upstream connection stays: the upstream answered, Sandgate could not go on.

// inputError is an exchange that failed on the input asked for; code is the event's outcome,
// words what the sandbox is told (Sandgate's own: no upstream bytes), err the detail.
type inputError struct {
	code  string
	words string
	err   error
}

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func inputFailed(code, words, format string, args ...any) error {
	return &inputError{code: code, words: words, err: fmt.Errorf(format, args...)}
}

// failureCode is the outcome code of a forwarded request that failed with err.
func failureCode(err error) string {
	var ie *inputError
	switch {
	case errors.As(err, &ie):
		return ie.code
	case errors.Is(err, errUpstreamDown) || errors.Is(err, errBreakerOpen):
		return call.CodeUpstreamUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return call.CodeUpstreamTimeout
	}
	if code := boundCode(err); code != "" {
		return code
	}
	return call.CodeUpstreamError
}

// failureTexts are the words of each failure code, about an upstream named %s.
var failureTexts = map[string]string{
	call.CodeUpstreamUnavailable:      "upstream %s is unavailable",
	call.CodeUpstreamTimeout:          "upstream %s did not answer in time",
	call.CodeUpstreamTooLarge:         "upstream %s answered more than Sandgate's bounds allow",
	call.CodeUpstreamEncoding:         "upstream %s answered in a content coding Sandgate does not read",
	call.CodeUpstreamInputUnsupported: "upstream %s asked for input Sandgate cannot ask a sandbox for",
	call.CodeUpstreamInputUnanswered:  "upstream %s asked for input the sandbox did not give",
	call.CodeUpstreamInputExhausted:   "upstream %s kept asking for input",
	call.CodeUpstreamError:            "upstream %s failed",
}

// failure is the refusal of x's request, which failed with err: Sandgate's words for its code
// (and for the conditions of its own it can say more of: an open breaker, an exchange of input
// that could not complete), never the error's text, which is the event's detail, scrubbed. A
// credential in those words means the upstream sent it back: the event says so, though the
// words reach no sandbox.
func (x *exchange) failure(err error) *call.Refusal {
	u := x.up
	code := failureCode(err)
	words := fmt.Sprintf(failureTexts[code], u.cfg.Name)
	var ie *inputError
	switch {
	case errors.Is(err, errBreakerOpen):
		words = fmt.Sprintf("upstream %s: circuit breaker open after %d consecutive transport failures or timeouts; one call probes it every %s",
			u.cfg.Name, u.cfg.Breaker.Failures, u.cfg.Breaker.OpenFor.D())
	case errors.As(err, &ie) && ie.words != "":
		words = fmt.Sprintf("upstream %s: %s", u.cfg.Name, ie.words)
	}
	rf := call.Refuse(code, "%s (%s)", words, code)
	detail, echoed := x.g.guard.Current().ScrubString(err.Error())
	if echoed {
		x.cl.CredentialEchoed()
	}
	rf.Detail = detail
	return rf
}
