// Package call is the one request path of Sandgate, shared by the MCP gateway and the egress
// proxy: who is calling → what do they ask → what does policy say → act → exactly one audit
// event.
//
// A half (gateway or proxy) begins a Call for every sandbox-facing request, fills in the
// target, asks Authorize (audit health, admission, decision), acts, and ends the Call with
// Finish or Refuse. Everything that must be the same on both halves lives here and nowhere
// else: the order of the checks, the refusal codes and their HTTP status and provider error
// type (one table, refusal.go), the revision fallback, the credential name, bytes and tokens
// on the event, the span attributes and the metrics (audit write failures included).
//
// Requests refused before they can be read as a call (a foreign Origin, a malformed head, a
// session used from another address) are one event each too, through Core.Reject, which
// rate-limits them per source address and counts what it suppressed, so that a flood of
// garbage does not become a flood of disk writes.
//
// The package imports policy and audit and is imported by gateway and proxy, never the other
// way round.
package call
