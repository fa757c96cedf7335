package call

import (
	"unicode/utf8"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// The call's audit event is unexported: a half tells the call what it learned through the
// methods below, named for what happened, and reads it through the accessors. Every field is
// set here (test/layout's TestEventFieldsSetOnlyInCall keeps it so), and nothing a half notes
// after the call ended changes the event that was written.

// Identity is the caller the call was begun for.
func (cl *Call) Identity() identity.Identity { return cl.ev.Identity }

// Kind is the call's kind.
func (cl *Call) Kind() audit.Kind { return cl.ev.Kind }

// Target is what the call is about, as noted so far.
func (cl *Call) Target() audit.Target { return cl.ev.Target }

// OutcomeError is the outcome code noted so far ("": none).
func (cl *Call) OutcomeError() string { return cl.ev.Outcome.Error }

// Classify notes the call's kind once the half has read what the request is (an MCP POST is
// begun as audit.KindMCPRequest, before its message is read). Kinds are a closed set.
func (cl *Call) Classify(kind audit.Kind) {
	if cl.done.Load() || kind == cl.ev.Kind {
		return
	}
	cl.ev.Kind = kind
}

// Describe notes what the half learned of the call's target: each field t sets (a non-empty
// string, a non-nil count) replaces the event's.
func (cl *Call) Describe(t audit.Target) {
	if cl.done.Load() {
		return
	}
	e := &cl.ev.Target
	setString(&e.Upstream, t.Upstream)
	setString(&e.Tool, t.Tool)
	setString(&e.ArgsSHA256, t.ArgsSHA256)
	setString(&e.Method, t.Method)
	setString(&e.Host, t.Host)
	setString(&e.Path, t.Path)
	setString(&e.Route, t.Route)
	setString(&e.Model, t.Model)
	if t.Shown != nil {
		e.Shown = t.Shown
	}
	if t.Hidden != nil {
		e.Hidden = t.Hidden
	}
}

func setString(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// UsesCredential notes the name of the credential the call injects (never its value).
func (cl *Call) UsesCredential(name string) {
	if !cl.done.Load() {
		cl.ev.Credential = name
	}
}

// CredentialEchoed notes that a credential value was removed from what the sandbox got.
func (cl *Call) CredentialEchoed() {
	if !cl.done.Load() {
		cl.ev.Outcome.CredentialEchoed = true
	}
}

// Answered notes the HTTP status the sandbox got, unless the call's end already named one (a
// refusal or a failure noted earlier).
func (cl *Call) Answered(status int) {
	if !cl.done.Load() && cl.ev.Outcome.Status == 0 {
		cl.ev.Outcome.Status = status
	}
}

// SetUsage notes the model tokens the response reported.
func (cl *Call) SetUsage(in, out int64) {
	if !cl.done.Load() {
		cl.tokensIn, cl.tokensOut = in, out
	}
}

// CodeClientClosed is the outcome code of a call whose sandbox went away after its answer began
// and before it was complete (a stream it cancelled). It is noted, not a refusal: the status
// stays the one the sandbox got. A sandbox gone before any answer is cancelled (Cancelled).
const CodeClientClosed = "client_closed"

// Note notes an outcome code the call will end with that is not a refusal (a tool's error
// result, a tunnel's idle timeout, a budget spent mid-stream), leaving the status as answered.
// The first code noted stands.
func (cl *Call) Note(code string) {
	if !cl.done.Load() && cl.ev.Outcome.Error == "" {
		cl.ev.Outcome.Error = code
	}
}

// NoteRefusal notes r as Refuse does, without ending the call: for a refusal that is answered
// by someone else (mcp-go's "not found") before the call ends.
func (cl *Call) NoteRefusal(r *Refusal) {
	if !cl.done.Load() {
		cl.refused(r, r.Status())
	}
}

// NoteFailure notes r as Fail does, without ending the call: for an allowed call whose action
// failed after its answer began (a tunnel whose destination could not be dialled).
func (cl *Call) NoteFailure(r *Refusal) {
	if !cl.done.Load() {
		cl.failed(r)
	}
}

// refused sets the event of a call refused by r, answered with status.
func (cl *Call) refused(r *Refusal, status int) {
	cl.ev.Decision.Allow = false
	cl.ev.Decision.Reason = r.Reason
	cl.ev.Outcome.Error = r.Code
	cl.ev.Outcome.Status = status
	cl.ev.Outcome.Detail = cut(r.Detail, maxDetail)
}

// failed sets the event of an allowed call whose action failed as r says: the decision stands.
func (cl *Call) failed(r *Refusal) {
	cl.ev.Outcome.Error = r.Code
	cl.ev.Outcome.Status = r.Status()
	cl.ev.Outcome.Detail = cut(r.Detail, maxDetail)
}

// cut is s at most n bytes long, cut on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
