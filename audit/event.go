package audit

import (
	"time"

	"github.com/sandgate/sandgate/internal/identity"
)

// Kind is what a sandbox-facing request was: the audit event's kind and, for the kinds policy
// decides, the policy's input.kind. It is the one kind type of Sandgate; its values are bounded
// (metric labels).
type Kind string

// Kinds policy decides (input.kind).
const (
	KindToolsList     Kind = "mcp.tools_list"
	KindToolsCall     Kind = "mcp.tools_call"
	KindResourcesRead Kind = "mcp.resources_read"
	KindPromptsGet    Kind = "mcp.prompts_get"
	KindHTTPConnect   Kind = "http.connect"
	KindHTTPRequest   Kind = "http.request"
)

// Kinds of MCP requests that carry no policy decision of their own but reach Sandgate (and
// often an upstream) all the same: each is one event.
const (
	KindInitialize    Kind = "mcp.initialize"
	KindPing          Kind = "mcp.ping"
	KindResourcesList Kind = "mcp.resources_list"
	KindTemplatesList Kind = "mcp.resources_templates_list"
	KindPromptsList   Kind = "mcp.prompts_list"
	KindComplete      Kind = "mcp.completion"
	KindSubscribe     Kind = "mcp.resources_subscribe"
	KindUnsubscribe   Kind = "mcp.resources_unsubscribe"
	KindSetLevel      Kind = "mcp.logging_set_level"
	KindNotification  Kind = "mcp.notification"
	KindResponse      Kind = "mcp.response" // a sandbox's answer to a server request (sampling, elicitation, roots)
	KindStream        Kind = "mcp.stream"   // GET: the session's server-to-client stream
	// An upstream's request to a sandbox (roots/list, sampling/createMessage, elicitation/create,
	// ping), asked of the sandbox session its upstream session or call belongs to.
	KindServerRequest Kind = "mcp.server_request"
	KindSessionEnd    Kind = "mcp.session_end"
	KindOtherMethod   Kind = "mcp.other" // a method Sandgate does not serve: answered method-not-found
	// An MCP POST whose message could not be read (too large, cut, not JSON-RPC): the kind its
	// call has until the message is read, and keeps when it is not.
	KindMCPRequest Kind = "mcp.request"
	KindDiscover   Kind = "mcp.discover"             // server/discover (2026-07-28)
	KindListen     Kind = "mcp.subscriptions_listen" // subscriptions/listen (2026-07-28): a stream of list changes and resource updates
	KindTasks      Kind = "mcp.tasks"                // tasks/get, tasks/result, tasks/list, tasks/cancel, tasks/update
)

// KindToolChanged is not a request: the gateway found that an upstream's live definition of a
// tool differs from its pin (the pins file of the policy folder, `sandgate policy pin`) and
// hides the tool from every sandbox until it is pinned again. One event per change: Target
// names the upstream and the tool, Decision says it is hidden (allow false) and why, and
// Outcome.Error is ToolChangedCode. The identity is empty: no sandbox asked.
const KindToolChanged Kind = "mcp.tool_changed"

// Outcome codes of KindToolChanged events: a definition that differs from its pin, and a name
// two upstreams offer under the same exposed name (every one of them hidden).
const (
	ToolChangedCode      = "tool_changed"
	ToolNameConflictCode = "tool_name_conflict"
)

// Kinds of credential lifecycle events: a token minted for a sandbox run (the first of the
// run, or a refresh before expiry) and its revocation when the run ends. They are no sandbox's
// request: their identity is the run's (docs/credentials.md).
const (
	KindCredentialMint    Kind = "credential.mint"
	KindCredentialRefresh Kind = "credential.refresh"
	KindCredentialRevoke  Kind = "credential.revoke"
)

// Kinds of requests refused before they could be read as a call (protocol-level rejections).
const (
	KindMCPRejected  Kind = "mcp.rejected"
	KindHTTPRejected Kind = "http.rejected"
)

// Event is one audited call: exactly one per call, denied calls included. It is written as one
// JSON object on one line. It never holds a credential value, only the credential's name.
type Event struct {
	ID         string            `json:"id"`
	Time       time.Time         `json:"time"`
	Kind       Kind              `json:"kind"`
	Identity   identity.Identity `json:"identity"`
	Target     Target            `json:"target"`
	Decision   Decision          `json:"decision"`
	Credential string            `json:"credential,omitempty"`
	// CredentialToken names the minted token a call used (or a lifecycle event is about) by
	// its ID, never its value; nil for a static credential or none.
	CredentialToken *CredentialToken `json:"credential_token,omitempty"`
	// Limits is LimitsUnavailable when the call was admitted without being counted against its
	// budgets and rate limits (their store was unreachable and limits.failure_mode is fail_open);
	// empty otherwise.
	Limits  string  `json:"limits,omitempty"`
	Outcome Outcome `json:"outcome"`
	TraceID string  `json:"trace_id,omitempty"`
	// SpanID is the call's span, with TraceID when spans are made (OTEL_* variables): what ties
	// the event to its trace in a log store (the OTLP exporter sets both on the LogRecord).
	SpanID string          `json:"span_id,omitempty"`
	Shadow *ShadowDecision `json:"shadow,omitempty"` // a shadow policy's divergence, when ready in time (docs/policies.md)
	// PrevHash is the Hash of the line before this one in the log (empty for the first), and
	// Hash is the SHA-256 (HMAC-SHA-256 under the chain key, when keyed) over this event's line
	// with Hash itself empty: together a chain that reveals an edited, removed or reordered event.
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`

	// assignedID is the ID AssignID minted; Record keeps ev.ID only while it equals this.
	assignedID string
	// owed is what the event holds of the sink's reserve until it is written (reserve.go).
	owed int64
	// ack, set on the writer's copy of a blocking Record's event, hears of its write (delivery.go).
	ack chan error
}

// AssignID gives the event its ID before it is recorded, so that what is written about the call
// earlier (the policy decision log) can name it. The ID is minted here, never chosen by the
// caller: Record keeps it only while ev.ID is still the one AssignID set, and replaces any other.
func (ev *Event) AssignID() string {
	ev.ID = newID(time.Now())
	ev.assignedID = ev.ID
	return ev.ID
}

// CredentialToken is a token minted for a sandbox run, as an event names it.
type CredentialToken struct {
	Provider string    `json:"provider"`
	ID       string    `json:"id"`
	Expires  time.Time `json:"expires"`
}

// LimitsUnavailable is Event.Limits of a call admitted uncounted.
const LimitsUnavailable = "unavailable"

// Target is what the call was aimed at: an MCP upstream and tool, or an HTTP destination.
type Target struct {
	Upstream   string `json:"upstream,omitempty"`
	Tool       string `json:"tool,omitempty"`
	ArgsSHA256 string `json:"args_sha256,omitempty"`
	Method     string `json:"method,omitempty"`
	Host       string `json:"host,omitempty"`
	Path       string `json:"path,omitempty"`
	Route      string `json:"route,omitempty"`
	Model      string `json:"model,omitempty"`
	// Shown and Hidden count the tools (or resources, prompts) a list call returned and withheld.
	Shown  *int `json:"shown,omitempty"`
	Hidden *int `json:"hidden,omitempty"`
}

// Decision is the policy's answer as audited.
type Decision struct {
	Allow          bool   `json:"allow"`
	Reason         string `json:"reason"`
	PolicyRevision string `json:"policy_revision"`
	// WouldDeny is the code of the denial the policy made but did not enforce: the caller's
	// template is in report-only mode (enforce: false in the policy data), so the call was
	// allowed; Reason is the policy's reason for the denial. Empty for an enforced decision.
	WouldDeny string `json:"would_deny,omitempty"`
}

// ShadowDecision is what a shadow policy decided for the call where it differs from the
// enforced decision; it never changed the outcome.
type ShadowDecision struct {
	Allow    bool   `json:"allow"`
	Reason   string `json:"reason"`
	Code     string `json:"code"`
	Revision string `json:"revision"`
}

// Outcome is what happened after the decision.
type Outcome struct {
	Status     int     `json:"status"`
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	BytesIn    int64   `json:"bytes_in"`
	BytesOut   int64   `json:"bytes_out"`
	TokensIn   int64   `json:"tokens_in,omitempty"`
	TokensOut  int64   `json:"tokens_out,omitempty"`
	// CredentialEchoed says the upstream sent a credential value back (in a header, trailer,
	// 1xx response or the body) and Sandgate removed it before it reached the sandbox.
	CredentialEchoed bool `json:"credential_echoed,omitempty"`
	// Detail is what failed, in the words of whatever failed (a transport's error, which can
	// quote an upstream's bytes), scrubbed of credentials and cut short: kept here only, never
	// in what Sandgate answers, which says only its code's fixed reason.
	Detail string `json:"detail,omitempty"`
}
