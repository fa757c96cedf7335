package call

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/policy"
)

// Credentials is where credential values come from (*credential.Store).
type Credentials interface {
	Get(name string) (string, bool)
}

// noCredentials holds no value.
type noCredentials struct{}

func (noCredentials) Get(string) (string, bool) { return "", false }

// MintedCredentials is a credential source that also mints credentials for each sandbox run
// (*credential.Store with minted credentials): takeCredential takes the run's token of such a
// credential instead of a static value.
type MintedCredentials interface {
	Credentials
	Minted(name string) bool
	// Destination is the minted credential in's destination injects ("" none).
	Destination(in *policy.Input) string
	// ScopeOf is input.credential of a call of run to a destination injecting name, with its
	// fingerprint.
	ScopeOf(name string, run credential.Run) (*policy.Credential, string)
	Take(ctx context.Context, name string, run credential.Run, scope *policy.Credential, fp string) (credential.Lease, error)
}

// mintedScope is what Authorize put in the input as input.credential, for takeCredential to
// mint exactly that: what policy decided on is what the token may reach.
type mintedScope struct {
	scope *policy.Credential
	fp    string
	run   credential.Run
}

// takeCredential is the one credential step of both halves, after policy allowed the call:
// configured is the name of the credential the destination is configured with ("" none) and
// chosen the one policy's decision named ("" none). Only the configured credential can ever be
// injected: a policy naming another is refused (credential_not_configured, 403), and a
// configured credential without a value is refused rather than sent without it
// (credential_unavailable, 502). A credential minted per run is the run's token, minted now if
// the run has none: a provider that cannot mint it refuses the call (credential_unavailable,
// 503, with the provider's reason in Sandgate's words and Retry-After). The call's event names
// the credential, and a minted token's provider, ID and expiry; the value is returned for the
// half to inject, and never kept in the event.
func (cl *Call) takeCredential(configured, chosen string) (string, *Refusal) {
	if configured == "" {
		if chosen != "" {
			return "", Refuse(CodeCredentialNotConfigured, "policy chose credential %q but this destination has no credential configured", chosen)
		}
		return "", nil
	}
	if chosen != "" && chosen != configured {
		return "", Refuse(CodeCredentialNotConfigured, "policy chose credential %q but this destination is configured with %q", chosen, configured)
	}
	src := cl.core.opts.Credentials
	if m, ok := src.(MintedCredentials); ok && m.Minted(configured) {
		return cl.takeMinted(m, configured)
	}
	v, ok := src.Get(configured)
	if !ok || v == "" {
		return "", Refuse(CodeCredentialUnavailable, "credential %q is not available", configured)
	}
	cl.UsesCredential(configured)
	return v, nil
}

// takeMinted takes the run's token of the minted credential name.
func (cl *Call) takeMinted(m MintedCredentials, name string) (string, *Refusal) {
	s := cl.minted
	if s == nil || s.scope.Name != name {
		// A destination its input did not name (a call decided before its target was known):
		// the scope is the run's now.
		run := credential.RunOf(cl.Identity(), nil)
		sc, fp := m.ScopeOf(name, run)
		s = &mintedScope{scope: sc, fp: fp, run: run}
	}
	lease, err := m.Take(cl.ctx, name, s.run, s.scope, s.fp)
	if err != nil {
		rf := &Refusal{Code: CodeCredentialUnavailable, class: ClassUnavailable, classSet: true}
		if u, ok := credential.IsUnavailable(err); ok {
			rf.Reason = fmt.Sprintf("credential %q (%s) is unavailable: %s", name, u.Provider, u.Reason)
			rf.RetryAfter = max(u.RetryAfter, time.Second)
		} else {
			rf.Reason = fmt.Sprintf("credential %q is unavailable", name)
		}
		cl.UsesCredential(name)
		return "", rf
	}
	if !cl.done.Load() {
		cl.ev.Credential = name
		st := cl.mintState()
		st.token = audit.CredentialToken{Provider: lease.Provider, ID: lease.ID, Expires: lease.Expires.UTC()}
		cl.ev.CredentialToken = &st.token
		st.taken = takenCredential{name: name, value: lease.Value}
		st.guard = lease.Guard
		cl.taken = &st.taken
	}
	return lease.Value, nil
}

// takenCredential is the minted value a call took, for the requests it sends (CredentialValue).
type takenCredential struct{ name, value string }

// CredentialValue is the value of credential name for a request sent on behalf of the call in
// ctx: the run's minted token the call took, else src's (static) value. A request of no call
// (an upstream's catalog) gets no minted credential: such a value belongs to a run.
func CredentialValue(ctx context.Context, src Credentials, name string) (string, bool) {
	if cl := From(ctx); cl != nil {
		if t := cl.taken; t != nil && t.name == name {
			return t.value, true
		}
	}
	if m, ok := src.(MintedCredentials); ok && m.Minted(name) {
		return "", false
	}
	return src.Get(name)
}

// scopeCredential puts input.credential in in when its destination injects a minted credential
// (after admission set the grants it derives from), and keeps it for takeCredential.
func (cl *Call) scopeCredential(in *policy.Input) {
	m, ok := cl.core.opts.Credentials.(MintedCredentials)
	if !ok {
		return
	}
	name := m.Destination(in)
	if name == "" {
		return
	}
	run := credential.RunOf(in.Identity, in.Grants)
	sc, fp := m.ScopeOf(name, run)
	in.Credential = sc
	st := cl.mintState()
	st.scope = mintedScope{scope: sc, fp: fp, run: run}
	cl.minted = &st.scope
}

// mintState is what a call of a minted credential keeps (Call.mint), made on first use: its
// scope, the token it took and the event's name of that token, in one allocation.
type mintState struct {
	scope mintedScope
	taken takenCredential
	token audit.CredentialToken
	guard *credential.GuardSlot
}

// GuardSlot is the response guard's slot of the run whose minted token the call took (nil:
// it took none): respguard.Source.ForSlot.
func (cl *Call) GuardSlot() *credential.GuardSlot {
	if cl.mint == nil {
		return nil
	}
	return cl.mint.guard
}

func (cl *Call) mintState() *mintState {
	if cl.mint == nil {
		cl.mint = &mintState{}
	}
	return cl.mint
}

// CredentialEvent writes one lifecycle event of a minted token (credential.mint,
// credential.refresh, credential.revoke) to the audit log: the run's identity, the credential,
// the token's provider, ID and expiry, and why. It is no sandbox's call: no call metric counts
// it, and an audit log that cannot take it logs and counts the failure as for a call.
func (c *Core) CredentialEvent(e credential.Event) {
	kind := map[credential.EventKind]audit.Kind{credential.EventMint: audit.KindCredentialMint,
		credential.EventRefresh: audit.KindCredentialRefresh, credential.EventRevoke: audit.KindCredentialRevoke}[e.Kind]
	ev := &audit.Event{Kind: kind, Time: time.Now().UTC(), Credential: e.Credential}
	ev.Identity.Namespace, ev.Identity.Sandbox, ev.Identity.Claim, ev.Identity.Template = e.Run.Namespace, e.Run.Sandbox, e.Run.Claim, e.Run.Template
	ev.Identity.Known = true
	if e.TokenID != "" {
		ev.CredentialToken = &audit.CredentialToken{Provider: e.Provider, ID: e.TokenID, Expires: e.Expires.UTC()}
	}
	ev.Decision.Allow, ev.Decision.Reason = true, e.Reason
	if ev.Decision.Reason == "" {
		ev.Decision.Reason = "minted for the run (" + e.Provider + ")"
	}
	ev.Decision.PolicyRevision = c.opts.Policy.Revision()
	ev.Outcome.DurationMS = float64(e.Duration.Microseconds()) / 1000
	if e.Failed {
		ev.Outcome.Error = CodeCredentialUnavailable
		if e.Kind == credential.EventRevoke {
			ev.Outcome.Error = OutcomeRevokeFailed
		}
	}
	ev.AssignID()
	if err := c.opts.Audit.Record(ev); err != nil {
		c.metrics.auditErrors.Add(context.Background(), 1)
		c.log.Error("audit event not recorded", "kind", ev.Kind, "credential", e.Credential, "run", e.Run.Key, "err", err)
	}
}
