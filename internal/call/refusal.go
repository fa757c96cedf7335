package call

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/limits"
)

// Class is what kind of refusal a code is. It decides the HTTP status, the provider error type
// and the JSON-RPC answer: the same on both halves for the same code.
type Class int

// Classes of refusals.
const (
	// ClassPolicy is a denial by policy (or by a check that stands for policy: an unknown
	// caller, a destination the dial guard refuses, a credential policy may not choose).
	ClassPolicy Class = iota
	// ClassLimit is a budget, rate limit or cap that a later call may pass.
	ClassLimit
	// ClassUnavailable is Sandgate itself unable to decide or record safely (audit log down,
	// limits store down with fail_closed, shutting down, an upstream circuit open).
	ClassUnavailable
	// ClassNotFound is something that does not exist for this caller.
	ClassNotFound
	// ClassBadRequest is a request Sandgate cannot read as a call.
	ClassBadRequest
	// ClassTooLarge is a body over its limit.
	ClassTooLarge
	// ClassHeaderTooLarge is a request head over its limit.
	ClassHeaderTooLarge
	// ClassMisdirected is a request sent on a connection for another host.
	ClassMisdirected
	// ClassMediaType is a body of a type the endpoint does not take.
	ClassMediaType
	// ClassTimeout is a client too slow to send its request.
	ClassTimeout
	// ClassUpstream is an upstream that failed or could not be reached.
	ClassUpstream
	// ClassUpstreamTimeout is an upstream that did not answer in time.
	ClassUpstreamTimeout
	// ClassCancelled is a request its client cancelled or went away from before its answer.
	ClassCancelled
)

// classInfo is one row of the refusal table.
type classInfo struct {
	status        int
	anthropicType string // Anthropic's error.type for this status
	openAIType    string // OpenAI's error.type
}

// classes is the one table from refusal class to HTTP status and provider error types
// (docs/policies.md, "Refusals", prints it). Anthropic's SDK picks its exception class from the
// status and type; OpenAI's from the status.
var classes = map[Class]classInfo{
	ClassPolicy:          {http.StatusForbidden, "permission_error", "permission_error"},
	ClassLimit:           {http.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded"},
	ClassUnavailable:     {http.StatusServiceUnavailable, "api_error", "server_error"},
	ClassNotFound:        {http.StatusNotFound, "not_found_error", "not_found_error"},
	ClassBadRequest:      {http.StatusBadRequest, "invalid_request_error", "invalid_request_error"},
	ClassTooLarge:        {http.StatusRequestEntityTooLarge, "request_too_large", "invalid_request_error"},
	ClassHeaderTooLarge:  {http.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "invalid_request_error"},
	ClassMisdirected:     {http.StatusMisdirectedRequest, "invalid_request_error", "invalid_request_error"},
	ClassMediaType:       {http.StatusUnsupportedMediaType, "invalid_request_error", "invalid_request_error"},
	ClassTimeout:         {http.StatusRequestTimeout, "invalid_request_error", "invalid_request_error"},
	ClassUpstream:        {http.StatusBadGateway, "api_error", "server_error"},
	ClassUpstreamTimeout: {http.StatusGatewayTimeout, "api_error", "server_error"},
	// 499: no standard status says "the client closed the request"; nginx's is the one logs know.
	ClassCancelled: {statusClientClosed, "api_error", "server_error"},
}

// statusClientClosed is the status of a call its client cancelled (nginx's 499).
const statusClientClosed = 499

// Codes Sandgate itself refuses with. A policy's own codes (the decision's `code`) are
// ClassPolicy; limit codes come from package limits.
const (
	CodeAuditUnavailable = "audit_unavailable"
	CodeUnknownCaller    = "unknown_caller"
	CodeShuttingDown     = "shutting_down"
	// CodeShutdown is the outcome of a call still running when the shutdown drain was over:
	// it was cut (its answer incomplete) and its event says so.
	CodeShutdown                = "shutdown"
	CodeNotFound                = "not_found"
	CodeNoRoute                 = "no_route"
	CodeSessionNotOwned         = "session_not_owned"
	CodeSessionRequired         = "session_required"
	CodeSessionLimit            = "session_limit"
	CodeBatchRefused            = "batch_refused"
	CodeBadOrigin               = "bad_origin"
	CodeBadHost                 = "bad_host"
	CodeUnsupportedMediaType    = "unsupported_media_type"
	CodeBodyTooLarge            = "body_too_large"
	CodeHeaderTooLarge          = "header_too_large"
	CodeMalformedRequest        = "malformed_request"
	CodeHeaderTimeout           = "header_timeout"
	CodeBodyTimeout             = "body_timeout"
	CodeBadPath                 = "bad_path"
	CodeBadScheme               = "bad_scheme"
	CodeBadModelRequest         = "bad_model_request"
	CodeBadParams               = "bad_params" // JSON-RPC params readers read differently (gateway/params.go)
	CodeBodyReadFailed          = "body_read_failed"
	CodeHostMismatch            = "host_mismatch"
	CodeHostNotConfigured       = "host_not_configured"
	CodeAbsoluteURIInTunnel     = "absolute_uri_in_tunnel"
	CodeRequestSmuggling        = "request_smuggling"
	CodeTooManyTunnels          = "too_many_tunnels"
	CodeTooManyConnections      = "too_many_connections"
	CodeAdminFromSandbox        = "admin_from_sandbox"
	CodeCredentialNotConfigured = "credential_not_configured"
	CodeCredentialUnavailable   = "credential_unavailable"
	CodeUpstreamError           = "upstream_error"
	CodeUpstreamTimeout         = "upstream_timeout"
	CodeUpstreamTruncated       = "upstream_truncated"
	CodeUpstreamUnavailable     = "upstream_unavailable"
	// An upstream's answer that Sandgate cannot pass on checked: in a content coding it does
	// not decode, larger than its bound (a decompression bomb, a configured cap), or a part of
	// a representation (206) answering a request that carried a credential.
	CodeUpstreamEncoding = "upstream_encoding"
	CodeUpstreamTooLarge = "upstream_too_large"
	CodeUpstreamPartial  = "upstream_partial"
	// A 2026-07-28 upstream's multi round-trip request (input_required) that could not be
	// completed: it asked for input of a method no sandbox can be asked for, the sandbox did
	// not answer, or it kept asking past the round-trip bound.
	CodeUpstreamInputUnsupported = "upstream_input_unsupported"
	CodeUpstreamInputUnanswered  = "upstream_input_unanswered"
	CodeUpstreamInputExhausted   = "upstream_input_exhausted"
	CodeResolveFailed            = "resolve_failed"
	CodeNoAddress                = "no_address"
	// CodeCancelled is a call its client cancelled (notifications/cancelled, a closed stream or
	// connection) before it was answered: an outcome, never a decision.
	CodeCancelled = "cancelled"
	// CodeHeaderMismatch is an MCP request whose standard headers (Mcp-Method, Mcp-Name) say
	// other than its body (MCP 2026-07-28: JSON-RPC error -32020).
	CodeHeaderMismatch = "header_mismatch"
	// CodeUnsupportedVersion is an MCP request of a protocol revision Sandgate does not serve
	// (JSON-RPC error -32022).
	CodeUnsupportedVersion = "unsupported_protocol_version"
)

// OutcomeRevokeFailed is the outcome of a credential.revoke event whose provider did not
// confirm the revocation: no call is refused with it, so it is no refusal code.
const OutcomeRevokeFailed = "revoke_failed"

// codes gives the class of every code Sandgate makes. A code not listed is a policy's own.
var codes = map[string]Class{
	CodeAuditUnavailable:                ClassUnavailable,
	CodeUnknownCaller:                   ClassPolicy,
	CodeShuttingDown:                    ClassUnavailable,
	CodeShutdown:                        ClassUnavailable,
	CodeNotFound:                        ClassNotFound,
	CodeNoRoute:                         ClassNotFound,
	CodeSessionNotOwned:                 ClassNotFound, // as the MCP spec answers an unknown session: nothing tells it exists
	CodeSessionRequired:                 ClassBadRequest,
	CodeSessionLimit:                    ClassLimit,
	CodeBatchRefused:                    ClassBadRequest,
	CodeBadOrigin:                       ClassPolicy,
	CodeBadHost:                         ClassPolicy,
	CodeUnsupportedMediaType:            ClassMediaType,
	CodeBodyTooLarge:                    ClassTooLarge,
	CodeHeaderTooLarge:                  ClassHeaderTooLarge,
	CodeMalformedRequest:                ClassBadRequest,
	CodeHeaderTimeout:                   ClassTimeout,
	CodeBodyTimeout:                     ClassTimeout,
	CodeBadPath:                         ClassBadRequest,
	CodeBadScheme:                       ClassBadRequest,
	CodeBadModelRequest:                 ClassBadRequest,
	CodeBadParams:                       ClassBadRequest,
	CodeBodyReadFailed:                  ClassBadRequest,
	CodeHostMismatch:                    ClassMisdirected,
	CodeHostNotConfigured:               ClassPolicy,
	CodeAbsoluteURIInTunnel:             ClassBadRequest,
	CodeRequestSmuggling:                ClassBadRequest,
	CodeTooManyTunnels:                  ClassLimit,
	CodeTooManyConnections:              ClassLimit,
	CodeAdminFromSandbox:                ClassPolicy,
	CodeCredentialNotConfigured:         ClassPolicy,
	CodeCredentialUnavailable:           ClassUpstream, // a static credential's; a minted one's is ClassUnavailable (credential.go)
	CodeUpstreamError:                   ClassUpstream,
	CodeUpstreamTimeout:                 ClassUpstreamTimeout,
	CodeUpstreamTruncated:               ClassUpstream, // the sandbox got 200 headers; the event says 502
	CodeUpstreamUnavailable:             ClassUnavailable,
	CodeUpstreamEncoding:                ClassUpstream,
	CodeUpstreamTooLarge:                ClassUpstream,
	CodeUpstreamPartial:                 ClassUpstream,
	CodeUpstreamInputUnsupported:        ClassUpstream,
	CodeUpstreamInputUnanswered:         ClassUpstream,
	CodeUpstreamInputExhausted:          ClassUpstream,
	CodeResolveFailed:                   ClassUpstream,
	CodeNoAddress:                       ClassUpstream,
	CodeCancelled:                       ClassCancelled,
	CodeHeaderMismatch:                  ClassBadRequest,
	CodeUnsupportedVersion:              ClassBadRequest,
	string(limits.CodeRateLimited):      ClassLimit,
	string(limits.CodeTokenBudgetSpent): ClassLimit,
	string(limits.CodeConcurrency):      ClassLimit,
	string(limits.CodeStoreUnavailable): ClassUnavailable,
}

// Refusal is a request Sandgate answers itself. Code is bounded: it is the audit event's
// outcome error and a metric label.
type Refusal struct {
	Code   string
	Reason string
	// Detail is what failed in words Sandgate did not choose (a transport's error, which can
	// quote an upstream): the audit event's outcome.detail, never answered. The half scrubs it
	// of credentials before it sets it (the reason stays Sandgate's own words: UpstreamFailure).
	Detail string
	// RetryAfter, when set, is sent as Retry-After (limits).
	RetryAfter time.Duration
	// Close asks the half to close the connection after answering (the rest of a body unread).
	Close bool
	// class, when classSet, is the refusal's class instead of its code's: a minted credential
	// its provider cannot mint now is Sandgate unable to act (503, retried later), while a
	// static credential without a value stays the upstream failure it always was (502).
	class    Class
	classSet bool
}

// Refuse is the refusal for one of Sandgate's own codes.
func Refuse(code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// upstreamReasons are the words Sandgate answers an upstream's failure with: one fixed text per
// code, whatever the upstream sent. An error of the transport quotes what it could not read (a
// status line, a header, a certificate's names), which an upstream chooses: it goes to the
// event's detail only.
var upstreamReasons = map[string]string{
	CodeUpstreamError:            "the upstream's answer could not be read",
	CodeUpstreamTimeout:          "upstream did not answer in time",
	CodeUpstreamUnavailable:      "the upstream is unavailable",
	CodeUpstreamTruncated:        "the upstream's response ended before it was complete",
	CodeUpstreamEncoding:         "the upstream answered in a content coding Sandgate does not decode, or with codings it cannot account for",
	CodeUpstreamTooLarge:         "the upstream's answer is larger than allowed",
	CodeUpstreamPartial:          "the upstream answered with part of a response, which is not passed on where a credential was sent",
	CodeUpstreamInputUnsupported: "the upstream asked for input no sandbox can be asked for",
	CodeUpstreamInputUnanswered:  "the upstream's request for input was not answered",
	CodeUpstreamInputExhausted:   "the upstream asked for input more times than allowed",
}

// UpstreamFailure is the refusal of an upstream's failure with code: its fixed reason, and
// detail (scrubbed by the caller) for the event.
func UpstreamFailure(code, detail string) *Refusal {
	reason, ok := upstreamReasons[code]
	if !ok {
		code, reason = CodeUpstreamError, upstreamReasons[CodeUpstreamError]
	}
	return &Refusal{Code: code, Reason: reason, Detail: detail}
}

// maxDetail bounds an event's outcome.detail.
const maxDetail = 512

// Class is the refusal's class: Sandgate's own codes from the table, any other code a policy's.
func (r *Refusal) Class() Class {
	if r.classSet {
		return r.class
	}
	if c, ok := codes[r.Code]; ok {
		return c
	}
	return ClassPolicy
}

// Status is the HTTP status of the refusal, the same on both halves.
func (r *Refusal) Status() int { return classes[r.Class()].status }

// ErrorType is the provider's error type for the refusal: Anthropic's, or OpenAI's when
// openAI is set.
func (r *Refusal) ErrorType(openAI bool) string {
	if openAI {
		return classes[r.Class()].openAIType
	}
	return classes[r.Class()].anthropicType
}

// SetHeaders sets the response headers every refusal carries on either half: Retry-After, in
// whole seconds rounded up, when the refusal knows when a retry may pass (a limit's window).
func (r *Refusal) SetHeaders(h http.Header) {
	if r.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(r.RetryAfter.Seconds()))))
	}
}
