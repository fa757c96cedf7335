package credential

import (
	"crypto/sha256"
	"encoding/hex"
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
}

// TokenID names a token in events and logs without revealing it: "sha256:" and the first 16
// hex digits of its SHA-256. Whoever holds the token can compute it; nobody can go back.
func TokenID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:8])
}
