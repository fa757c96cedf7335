package identity

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

type fakeOwners map[string]*unstructured.Unstructured // "kind/name" → object

func (f fakeOwners) claim(_, name string) *unstructured.Unstructured    { return f["claim/"+name] }
func (f fakeOwners) warmPool(_, name string) *unstructured.Unstructured { return f["pool/"+name] }

func ownedSandbox(name, annotation string, kind, owner string, uid types.UID) *unstructured.Unstructured {
	sb := fakeSandbox(name, "u-"+name)
	if annotation != "" {
		sb.SetAnnotations(map[string]string{AnnotationTemplateRef: annotation})
	}
	if kind != "" {
		yes := true
		sb.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: SandboxClaimGroup + "/v1beta1", Kind: kind, Name: owner, UID: uid, Controller: &yes}})
	}
	return sb
}

func TestProvenance(t *testing.T) {
	pool := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "wp-coding", "namespace": "ns", "uid": "u-pool"},
		"spec":     map[string]any{"sandboxTemplateRef": map[string]any{"name": "coding-agent"}},
	}}
	claim := func(bound string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": "task-2", "namespace": "ns", "uid": "u-claim"},
			"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "wp-coding"}},
			"status":   map[string]any{"sandbox": map[string]any{"name": bound}},
		}}
	}
	both := fakeOwners{"pool/wp-coding": pool, "claim/task-2": claim("wp-coding-x7k2q")}
	coding := TemplateRefHash("coding-agent")
	for _, tc := range []struct {
		name     string
		sb       *unstructured.Unstructured
		podHash  string
		owners   fakeOwners
		template string
		claim    string
		why      Provenance
	}{
		{"a plain Sandbox has no template and no claim",
			ownedSandbox("plain", "", "", "", ""), "", both, "", "", ProvenanceVerified},
		{"a Sandbox created directly with a template annotation is refused (the controller gave its pod no hash)",
			ownedSandbox("forged", "coding-agent", "", "", ""), "", both, "", "", ProvenanceAnnotationMismatch},
		{"a hash on the pod of a Sandbox no claim or pool controls is refused",
			ownedSandbox("forged", "", "", "", ""), coding, both, "", "", ProvenanceHashMismatch},
		{"a claimed warm-pool sandbox has the pool's template and the claim, whatever its name",
			ownedSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-claim"), coding, both, "coding-agent", "task-2", ProvenanceVerified},
		{"with the pool gone, the annotation counts only when the controller's hash matches it",
			ownedSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-claim"), coding,
			fakeOwners{"claim/task-2": claim("wp-coding-x7k2q")}, "coding-agent", "task-2", ProvenanceVerified},
		{"with the pool gone, an annotation the hash does not match is refused",
			ownedSandbox("wp-coding-x7k2q", "admin-agent", KindSandboxClaim, "task-2", "u-claim"), coding,
			fakeOwners{"claim/task-2": claim("wp-coding-x7k2q")}, "", "", ProvenanceHashMismatch},
		{"a Sandbox pointing at a claim bound to another sandbox is refused",
			ownedSandbox("intruder", "coding-agent", KindSandboxClaim, "task-2", "u-claim"), coding, both, "", "", ProvenanceClaimUnbound},
		{"a claim not yet bound gives nothing",
			ownedSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-claim"), coding,
			fakeOwners{"pool/wp-coding": pool, "claim/task-2": claim("")}, "", "", ProvenancePending},
		{"an ownerReference with another UID than the claim's is refused",
			ownedSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-other"), coding, both, "", "", ProvenanceOwnerMissing},
		{"a claim that does not exist is refused",
			ownedSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-9", "u-claim"), coding, both, "", "", ProvenanceOwnerMissing},
		{"an annotation naming another template than the claim's pool is refused",
			ownedSandbox("wp-coding-x7k2q", "admin-agent", KindSandboxClaim, "task-2", "u-claim"), coding, both, "", "", ProvenanceAnnotationMismatch},
		{"a pod hash of another template than the claim's pool is refused",
			ownedSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-claim"), TemplateRefHash("admin-agent"), both, "", "", ProvenanceHashMismatch},
		{"an unclaimed warm-pool sandbox has the pool's template and no claim",
			ownedSandbox("wp-coding-abcde", "coding-agent", KindSandboxWarmPool, "wp-coding", "u-pool"), coding, both, "coding-agent", "", ProvenanceVerified},
		{"a pod of a pool sandbox without the controller's hash is refused",
			ownedSandbox("wp-coding-abcde", "", KindSandboxWarmPool, "wp-coding", "u-pool"), "", both, "", "", ProvenanceHashMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			template, claim, why := provenance(tc.sb, tc.podHash, tc.owners)
			assert.Equal(t, tc.why, why)
			assert.Equal(t, tc.template, template)
			assert.Equal(t, tc.claim, claim)
		})
	}
}

func TestTemplateRefHash(t *testing.T) {
	// Values of the upstream controller's NameHash (FNV-1a 32, eight hex digits).
	assert.Equal(t, "811c9dc5", TemplateRefHash(""))
	assert.Len(t, TemplateRefHash("coding-agent"), 8)
}
