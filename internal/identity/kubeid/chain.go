package kubeid

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/identity"
)

// Link names a link of the identity chain pod IP → Pod → Sandbox → (claim → warm pool →
// template). Every link is checked both ways, on facts only the Agent Sandbox controller or the
// kubelet write (docs/kubernetes.md, "What identity rests on"); the first link that does not hold
// makes the caller unknown, and its name flows unchanged into the event
// (Identity.Unverified), the log line and the metric label.
type Link string

// Values of Link. Verified is the empty link: every link held.
const (
	Verified = Link("")
	// LinkHostNetwork: the pod shares its node's network, so its address is the node's and
	// says nothing about which sandbox is calling.
	LinkHostNetwork = Link("host_network")
	// LinkSandbox: pod → Sandbox. The pod has no controlling ownerReference to a Sandbox that
	// exists with that UID and is not being deleted.
	LinkSandbox = Link("sandbox")
	// LinkPod: Sandbox → pod. The Sandbox's status.podIPs (written by the controller from the
	// one pod it owns) are not the pod's addresses, or the pod's sandbox-name-hash label (stamped
	// by the controller) is not the Sandbox's.
	LinkPod = Link("pod")
	// LinkClaim: Sandbox ↔ SandboxClaim. The controlling claim does not exist with the
	// ownerReference's UID, or its status.sandbox.name (written by the claim controller) names
	// another sandbox or none yet.
	LinkClaim = Link("claim")
	// LinkWarmPool: the template's source. A Sandbox still controlled by a SandboxWarmPool
	// (nothing the controller writes lists a pool's members, so one created by hand with an
	// ownerReference to the pool looks the same), or a claim whose warm pool is gone.
	LinkWarmPool = Link("warm_pool")
	// LinkTemplate: what the pod and the Sandbox say of their template (the controller's
	// template-ref-hash label on the pod, the sandbox-template-ref annotation) contradicts the
	// template the claim's warm pool names, is missing where there is one, or claims one where
	// there is none.
	LinkTemplate = Link("template")
)

// Unverified is the value of Identity.Unverified for a failed link.
func (l Link) Unverified() string {
	if l == Verified {
		return ""
	}
	return identity.UnverifiedPrefix + string(l)
}

// verdict is the outcome of verifying one sandbox pod.
type verdict struct {
	sandbox, template, claim string
	link                     Link // Verified, or the first link that did not hold
	// transient: a state the controller passes through (a claim not bound yet, a pod the
	// Sandbox does not name yet, a warm-pool sandbox nobody claimed): unknown, but no warning.
	transient bool
}

func refused(l Link) verdict   { return verdict{link: l} }
func transient(l Link) verdict { return verdict{link: l, transient: true} }

// chainObjects looks up the objects a pod's identity rests on, from informer caches.
type chainObjects interface {
	sandbox(namespace, name string) *unstructured.Unstructured
	claim(namespace, name string) *unstructured.Unstructured
	warmPool(namespace, name string) *unstructured.Unstructured
}

// verify walks the identity chain of a live sandbox pod with addresses addrs:
//
//   - pod → Sandbox: the pod's controlling ownerReference names a Sandbox that exists with that
//     UID; Sandbox → pod: the Sandbox's status.podIPs are the pod's addresses and the pod's
//     sandbox-name-hash label is the hash of the Sandbox's name. The controller writes both only
//     for the one pod it owns (two pods owning one Sandbox clear status.podIPs).
//   - a Sandbox no claim or pool controls is the caller, without a template;
//   - Sandbox → claim: the controlling SandboxClaim exists with the ownerReference's UID; claim
//     → Sandbox: its status.sandbox.name names the Sandbox. The template is the one the claim's
//     warm pool references (the claim controller keeps the Sandbox's hash label, and the
//     Sandbox controller the pod's, equal to that template's hash);
//   - a Sandbox its warm pool still controls is unknown: no fact only the controller writes
//     says it is a member of the pool.
//
// The pod's template-ref-hash label must be the template's hash and the Sandbox's
// sandbox-template-ref annotation must name the template (both absent without a template).
func verify(pod *corev1.Pod, addrs []netip.Addr, o chainObjects) verdict {
	if pod.Spec.HostNetwork {
		return refused(LinkHostNetwork)
	}
	ref := sandboxOwner(pod)
	if ref == nil {
		return refused(LinkSandbox)
	}
	sb := o.sandbox(pod.Namespace, ref.Name)
	if sb == nil || sb.GetUID() != ref.UID || sb.GetDeletionTimestamp() != nil {
		return refused(LinkSandbox)
	}
	if pod.Labels[identity.LabelSandboxNameHash] != identity.NameHash(sb.GetName()) {
		return refused(LinkPod)
	}
	named, _, _ := unstructured.NestedStringSlice(sb.Object, "status", "podIPs")
	if len(named) == 0 {
		return transient(LinkPod) // not named yet (or the controller refuses to choose a pod)
	}
	if !sameAddrs(named, addrs) {
		return refused(LinkPod)
	}
	v := templateAndClaim(sb, o)
	if v.link != Verified {
		return v
	}
	want := ""
	if v.template != "" {
		want = identity.NameHash(v.template)
	}
	if pod.Labels[identity.LabelTemplateRefHash] != want {
		return refused(LinkTemplate)
	}
	// The annotation is the one record of the template the Sandbox was built from: the pool or
	// claim controller writes it when it creates the Sandbox and never after, while the hash
	// labels follow a re-pointed pool or claim (the claim controller rewrites the Sandbox's, the
	// Sandbox controller then the pod's). Anyone who may patch the Sandbox may delete it, so it
	// must be there: a missing record is unknown, never "no contradiction".
	if sb.GetAnnotations()[identity.AnnotationTemplateRef] != v.template {
		return refused(LinkTemplate)
	}
	v.sandbox = sb.GetName()
	return v
}

// templateAndClaim follows the Sandbox's controlling extensions object, if any.
func templateAndClaim(sb *unstructured.Unstructured, o chainObjects) verdict {
	ns := sb.GetNamespace()
	ref := controllerOf(sb)
	switch {
	case ref == nil:
		return verdict{}
	case ref.kind == KindSandboxWarmPool:
		return transient(LinkWarmPool)
	case ref.kind != KindSandboxClaim:
		return refused(LinkClaim)
	}
	c := o.claim(ns, ref.name)
	if c == nil || c.GetUID() != ref.uid || c.GetDeletionTimestamp() != nil {
		return refused(LinkClaim)
	}
	switch bound, _, _ := unstructured.NestedString(c.Object, "status", "sandbox", "name"); bound {
	case sb.GetName():
	case "":
		return transient(LinkClaim) // the controller has not bound (or adopted) it yet
	default:
		return refused(LinkClaim)
	}
	poolName, _, _ := unstructured.NestedString(c.Object, "spec", "warmPoolRef", "name")
	p := o.warmPool(ns, poolName)
	if p == nil || p.GetDeletionTimestamp() != nil {
		// Without the pool no fact the controller keeps names the template: the Sandbox's
		// annotation and hash label are its creator's to edit.
		return refused(LinkWarmPool)
	}
	template, _, _ := unstructured.NestedString(p.Object, "spec", "sandboxTemplateRef", "name")
	if template == "" {
		return refused(LinkWarmPool)
	}
	return verdict{template: template, claim: c.GetName()}
}

// sameAddrs reports whether the Sandbox's status.podIPs are exactly the pod's addresses.
func sameAddrs(named []string, addrs []netip.Addr) bool {
	set := make(map[netip.Addr]bool, len(named))
	for _, s := range named {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return false
		}
		set[a.Unmap().WithZone("")] = true
	}
	if len(set) != len(addrs) {
		return false
	}
	for _, a := range addrs {
		if !set[a] {
			return false
		}
	}
	return true
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

// controllerOf returns the controlling ownerReference of sb when it is an extensions object
// (kind only: another kind of that group is refused by templateAndClaim).
func controllerOf(sb *unstructured.Unstructured) *ownerRef {
	for _, ref := range sb.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller {
			if groupOf(ref.APIVersion) != identity.SandboxClaimGroup {
				return nil
			}
			return &ownerRef{kind: ref.Kind, name: ref.Name, uid: ref.UID}
		}
	}
	return nil
}
