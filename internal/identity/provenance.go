package identity

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Provenance is why a sandbox's template and claim can (or cannot) be believed. The value of a
// refusal flows unchanged into the log line and the metric label.
type Provenance string

// Values of Provenance. Every value but ProvenanceVerified makes the caller unknown.
const (
	ProvenanceVerified = Provenance("")
	// ProvenanceOwnerMissing: the Sandbox is controlled by a SandboxClaim or SandboxWarmPool that
	// does not exist with the UID of the ownerReference (or is not in the cache yet).
	ProvenanceOwnerMissing = Provenance("owner_missing")
	// ProvenanceClaimUnbound: the controlling SandboxClaim's status.sandbox.name (written by the
	// claim controller) names another sandbox.
	ProvenanceClaimUnbound = Provenance("claim_unbound")
	// ProvenancePending: the controlling SandboxClaim names no sandbox yet, as for a moment
	// while the controller adopts a warm-pool sandbox. Unknown until then, but not a refusal
	// worth a warning or the metric.
	ProvenancePending = Provenance("claim_pending")
	// ProvenanceHashMismatch: the pod's template-ref-hash label (maintained by the controller)
	// is not the hash of the template its owners reference, or is missing, or is there without
	// an owner that references a template.
	ProvenanceHashMismatch = Provenance("template_hash_mismatch")
	// ProvenanceAnnotationMismatch: the Sandbox's sandbox-template-ref annotation, which its
	// creator can write, names a template its owners do not reference.
	ProvenanceAnnotationMismatch = Provenance("template_annotation_mismatch")
)

// owners looks up the extension objects a Sandbox may be controlled by, from informer caches.
type owners interface {
	claim(namespace, name string) *unstructured.Unstructured
	warmPool(namespace, name string) *unstructured.Unstructured
}

// provenance derives the template and claim of sandbox sb, whose pod carries podHash (the
// template-ref-hash label, "" when absent), only from facts a Sandbox creator cannot write:
//
//   - a Sandbox controlled by a SandboxClaim belongs to that claim when the claim exists with the
//     ownerReference's UID and its status.sandbox.name (written by the claim controller) names
//     the sandbox; its template is the one the claim's warm pool references (or, if the pool is
//     gone, the annotation's, which must then match the pod's hash);
//   - a Sandbox controlled by a SandboxWarmPool (not yet claimed) has the pool's template;
//   - any other Sandbox has no template.
//
// The pod's hash must be the hash of that template (absent when there is none), and an
// annotation, if present, must name it. Anything else is a refusal: the caller is unknown.
func provenance(sb *unstructured.Unstructured, podHash string, o owners) (template, claim string, why Provenance) {
	ns := sb.GetNamespace()
	annotated := sb.GetAnnotations()[AnnotationTemplateRef]
	ref := controllerOf(sb)
	switch {
	case ref != nil && ref.kind == KindSandboxClaim:
		c := o.claim(ns, ref.name)
		if c == nil || c.GetUID() != ref.uid || c.GetDeletionTimestamp() != nil {
			return "", "", ProvenanceOwnerMissing
		}
		switch bound, _, _ := unstructured.NestedString(c.Object, "status", "sandbox", "name"); bound {
		case sb.GetName():
		case "":
			return "", "", ProvenancePending
		default:
			return "", "", ProvenanceClaimUnbound
		}
		claim = c.GetName()
		pool, _, _ := unstructured.NestedString(c.Object, "spec", "warmPoolRef", "name")
		if p := o.warmPool(ns, pool); p != nil {
			template, _, _ = unstructured.NestedString(p.Object, "spec", "sandboxTemplateRef", "name")
		} else {
			template = annotated // checked against the controller's hash below
		}
	case ref != nil && ref.kind == KindSandboxWarmPool:
		p := o.warmPool(ns, ref.name)
		if p == nil || p.GetUID() != ref.uid {
			return "", "", ProvenanceOwnerMissing
		}
		template, _, _ = unstructured.NestedString(p.Object, "spec", "sandboxTemplateRef", "name")
	}
	want := ""
	if template != "" {
		want = TemplateRefHash(template)
	}
	if podHash != want {
		return "", "", ProvenanceHashMismatch
	}
	if annotated != "" && annotated != template {
		return "", "", ProvenanceAnnotationMismatch
	}
	return template, claim, ProvenanceVerified
}

// Kinds of the extension objects that control Sandboxes.
const (
	KindSandboxClaim    = "SandboxClaim"
	KindSandboxWarmPool = "SandboxWarmPool"
)

type ownerRef struct {
	kind, name string
	uid        types.UID
}

// controllerOf returns the controlling ownerReference of sb when it is an extensions object.
func controllerOf(sb *unstructured.Unstructured) *ownerRef {
	for _, ref := range sb.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller {
			if groupOf(ref.APIVersion) != SandboxClaimGroup {
				return nil
			}
			return &ownerRef{kind: ref.Kind, name: ref.Name, uid: ref.UID}
		}
	}
	return nil
}
