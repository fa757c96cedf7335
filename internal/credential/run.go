package credential

import (
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/identity"
)

// Run is one sandbox run, the lifetime of a minted credential: its SandboxClaim, or the
// Sandbox itself where no claim exists (a static identity, a sandbox made without a claim).
type Run struct {
	// Key is the run's grants key (grants.ClaimKey, else the identity's key): a minted
	// credential is keyed by (credential, Key) and never serves another key.
	Key string
	// SandboxKey is "namespace/sandbox": the run also ends when its sandbox is gone.
	SandboxKey                          string
	Namespace, Sandbox, Claim, Template string
	// Grants are the run's grants as policy saw them (what token_exchange puts in the run
	// token).
	Grants map[string]any
}

// RunOf is the run of a known caller with its grants.
func RunOf(id identity.Identity, grants map[string]any) Run {
	key := id.Key()
	r := Run{Key: key, SandboxKey: key, Namespace: id.Namespace, Sandbox: id.Sandbox,
		Claim: id.Claim, Template: id.Template, Grants: grants}
	if id.Claim != "" {
		r.Key = ClaimKey(id.Namespace, id.Claim)
	}
	return r
}

// ClaimKey is the key of a claim's run, the same as its grants' (grants.ClaimKey).
func ClaimKey(namespace, claim string) string { return namespace + "/claims/" + claim }

// Subject is the run token's sub: the claim, or the sandbox where no claim exists.
func (r Run) Subject() string {
	if r.Claim != "" {
		return "claim:" + r.Namespace + "/" + r.Claim
	}
	return "sandbox:" + r.Namespace + "/" + r.Sandbox
}

// Lease is a minted token as a call uses it. Value goes into the request only; ID, Provider
// and Expires go into the audit event.
type Lease struct {
	Value    string
	ID       string
	Provider string
	Expires  time.Time
	// Guard is the response guard's slot for the needles of the run's sandbox.
	Guard *GuardSlot
}

// GuardSlot is where a response guard keeps what it made of the tokens of a run's sandbox
// (respguard.Source.ForSlot: its needle set), so that a call holding one of the run's leases
// reaches it without a lookup among every sandbox's. Sandbox is the sandbox the run's tokens
// are counted for (Store.SandboxValues): the run's first.
type GuardSlot struct {
	Sandbox SandboxKey
	v       atomic.Value
}

// Load is what the guard kept in the slot, or nil.
func (g *GuardSlot) Load() any { return g.v.Load() }

// Store keeps v (always of one type) for the next Load.
func (g *GuardSlot) Store(v any) { g.v.Store(v) }

// TokenID names a token in events and logs without revealing it: "sha256:" and the first 16
// hex digits of its SHA-256. Whoever holds the token can compute it; nobody can go back.
func TokenID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:8])
}
