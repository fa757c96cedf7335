package audit

import (
	"net"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
)

// This file maps one audit log line to one OpenTelemetry LogRecord. docs/audit.md ("Shipping
// events") has the table; TestOTLPRecordFollowsTheMappingTable holds the two together.
//
// The body is the line exactly as written (so the chain can be verified from what a log store
// keeps, and nothing is lost in translation); attributes repeat the fields a query filters on,
// under the OpenTelemetry semantic conventions where one exists and under sandgate.* otherwise.

// Attribute keys of Sandgate's own fields.
const (
	AttrEventID        = "sandgate.event.id"
	AttrEventHash      = "sandgate.event.hash"
	AttrNamespace      = "sandgate.namespace"
	AttrSandbox        = "sandgate.sandbox"
	AttrTemplate       = "sandgate.template"
	AttrClaim          = "sandgate.claim"
	AttrKnown          = "sandgate.identity.known"
	AttrDecision       = "sandgate.decision"
	AttrReason         = "sandgate.reason"
	AttrPolicyRevision = "sandgate.policy.revision"
	AttrCredential     = "sandgate.credential"
	AttrCredentialProv = "sandgate.credential.provider"
	AttrCredentialID   = "sandgate.credential.token_id"
	AttrUpstream       = "sandgate.upstream"
	AttrRoute          = "sandgate.route"
	AttrLimits         = "sandgate.limits"
	AttrWouldDeny      = "sandgate.decision.would_deny"
)

// mcpMethods names the JSON-RPC method of each MCP kind that has one (mcp.method.name).
var mcpMethods = map[Kind]string{
	KindInitialize:    "initialize",
	KindPing:          "ping",
	KindToolsList:     "tools/list",
	KindToolsCall:     "tools/call",
	KindResourcesList: "resources/list",
	KindTemplatesList: "resources/templates/list",
	KindResourcesRead: "resources/read",
	KindSubscribe:     "resources/subscribe",
	KindUnsubscribe:   "resources/unsubscribe",
	KindPromptsList:   "prompts/list",
	KindPromptsGet:    "prompts/get",
	KindComplete:      "completion/complete",
	KindSetLevel:      "logging/setLevel",
}

// targetKeys names the semantic-convention attribute that carries Target.Tool for each kind: a
// tool's name, a resource's URI, a prompt's name.
var targetKeys = map[Kind]string{
	KindToolsCall:     "gen_ai.tool.name",
	KindResourcesRead: "mcp.resource.uri",
	KindSubscribe:     "mcp.resource.uri",
	KindUnsubscribe:   "mcp.resource.uri",
	KindPromptsGet:    "gen_ai.prompt.name",
}

// Severity of a record: a denied call is a warning, an allowed call whose action failed an
// error, anything else information.
func recordSeverity(ev *Event) (otellog.Severity, string) {
	switch {
	case ev.Kind == KindChain || ev.Kind == KindCheckpoint:
		return otellog.SeverityInfo, "INFO"
	case !ev.Decision.Allow:
		return otellog.SeverityWarn, "WARN"
	case ev.Outcome.Error != "":
		return otellog.SeverityError, "ERROR"
	}
	return otellog.SeverityInfo, "INFO"
}

// appendEventAttributes appends the record's attributes to a: each only when the event has the
// field, and each key at most once (the provider does not deduplicate keys).
func appendEventAttributes(a []attribute.KeyValue, ev *Event) []attribute.KeyValue {
	str := func(k, v string) {
		if v != "" {
			a = append(a, attribute.String(k, v))
		}
	}
	num := func(k string, v int64) {
		if v != 0 {
			a = append(a, attribute.Int64(k, v))
		}
	}
	str(AttrEventID, ev.ID)
	str(AttrEventHash, ev.Hash)
	if ev.Kind == KindChain || ev.Kind == KindCheckpoint {
		return a
	}
	id := &ev.Identity
	str("client.address", id.SourceIP)
	str(AttrNamespace, id.Namespace)
	str(AttrSandbox, id.Sandbox)
	str(AttrTemplate, id.Template)
	str(AttrClaim, id.Claim)
	a = append(a, attribute.Bool(AttrKnown, id.Known))
	decision := "deny"
	if ev.Decision.Allow {
		decision = "allow"
	}
	a = append(a, attribute.String(AttrDecision, decision))
	str(AttrReason, ev.Decision.Reason)
	str(AttrPolicyRevision, ev.Decision.PolicyRevision)
	str(AttrWouldDeny, ev.Decision.WouldDeny)
	str(AttrCredential, ev.Credential)
	if c := ev.CredentialToken; c != nil {
		str(AttrCredentialProv, c.Provider)
		str(AttrCredentialID, c.ID)
	}
	str(AttrLimits, ev.Limits)

	t := &ev.Target
	str(AttrUpstream, t.Upstream)
	str(AttrRoute, t.Route)
	str("mcp.method.name", mcpMethods[ev.Kind])
	if k, ok := targetKeys[ev.Kind]; ok {
		str(k, t.Tool)
	}
	if t.Host != "" {
		host, port, err := net.SplitHostPort(t.Host)
		if err != nil {
			host, port = t.Host, ""
		}
		str("server.address", host)
		if p, err := strconv.Atoi(port); err == nil {
			num("server.port", int64(p))
		}
	}
	str("http.request.method", t.Method)
	str("url.path", t.Path)
	str("gen_ai.request.model", t.Model)

	o := &ev.Outcome
	num("http.response.status_code", int64(o.Status))
	str("error.type", o.Error)
	num("gen_ai.usage.input_tokens", o.TokensIn)
	num("gen_ai.usage.output_tokens", o.TokensOut)
	return a
}
