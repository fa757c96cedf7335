package kubeid

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/identity"
)

type fakeObjects map[string]*unstructured.Unstructured // "kind/name" → object

func (f fakeObjects) sandbox(_, name string) *unstructured.Unstructured  { return f["sandbox/"+name] }
func (f fakeObjects) claim(_, name string) *unstructured.Unstructured    { return f["claim/"+name] }
func (f fakeObjects) warmPool(_, name string) *unstructured.Unstructured { return f["pool/"+name] }

// with returns a copy of f with objs added under "kind/name".
func (f fakeObjects) with(kv ...any) fakeObjects {
	out := fakeObjects{}
	for k, v := range f {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)], _ = kv[i+1].(*unstructured.Unstructured)
	}
	return out
}

// chainSandbox is a Sandbox as the controller leaves it: status.podIPs naming its pod's address,
// controlled by kind/owner when kind is set.
func chainSandbox(name, annotation, kind, owner string, uid types.UID, podIPs ...string) *unstructured.Unstructured {
	sb := fakeSandbox(name, "u-"+name)
	if annotation != "" {
		sb.SetAnnotations(map[string]string{identity.AnnotationTemplateRef: annotation})
	}
	if kind != "" {
		yes := true
		sb.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: identity.SandboxClaimGroup + "/v1beta1", Kind: kind, Name: owner, UID: uid, Controller: &yes}})
	}
	ips := make([]any, 0, len(podIPs))
	for _, ip := range podIPs {
		ips = append(ips, ip)
	}
	if len(ips) > 0 {
		_ = unstructured.SetNestedSlice(sb.Object, ips, "status", "podIPs")
	}
	return sb
}

// chainPod is a pod the controller made for sandbox sb, with the template hash label hash.
func chainPod(sb *unstructured.Unstructured, hash string, ips ...string) *corev1.Pod {
	p := fakePod(sb.GetName()+"-pod", sb.GetName(), string(sb.GetUID()), ips[0])
	p.Labels[identity.LabelSandboxNameHash] = identity.NameHash(sb.GetName())
	if hash != "" {
		p.Labels[identity.LabelTemplateRefHash] = hash
	}
	p.Status.PodIPs = nil
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func TestVerifyChain(t *testing.T) {
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
	coding := identity.NameHash("coding-agent")
	claimed := chainSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-claim", "10.0.0.1")
	plain := chainSandbox("plain", "", "", "", "", "10.0.0.2")
	base := fakeObjects{"pool/wp-coding": pool, "claim/task-2": claim("wp-coding-x7k2q"),
		"sandbox/wp-coding-x7k2q": claimed, "sandbox/plain": plain}

	type want struct {
		template, claim string
		link            Link
		transient       bool
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		objs fakeObjects
		want want
	}{
		{"a plain Sandbox's pod is its sandbox, without template or claim",
			chainPod(plain, "", "10.0.0.2"), base, want{}},
		{"a claimed warm-pool sandbox has the pool's template and the claim, whatever its name",
			chainPod(claimed, coding, "10.0.0.1"), base, want{template: "coding-agent", claim: "task-2"}},
		{"dual-stack: the Sandbox names every address of the pod",
			chainPod(chainSandbox("plain", "", "", "", "", "10.0.0.2", "fd00::2"), "", "10.0.0.2", "fd00::2"),
			base.with("sandbox/plain", chainSandbox("plain", "", "", "", "", "fd00::2", "10.0.0.2")), want{}},

		{"a pod on its node's network is refused (its address is the node's)",
			func() *corev1.Pod { p := chainPod(plain, "", "10.0.0.2"); p.Spec.HostNetwork = true; return p }(), base,
			want{link: LinkHostNetwork}},
		{"a pod whose ownerReference names a Sandbox that does not exist is refused",
			chainPod(chainSandbox("gone", "", "", "", "", "10.0.0.3"), "", "10.0.0.3"), base, want{link: LinkSandbox}},
		{"a pod whose ownerReference has another UID than the Sandbox's is refused",
			func() *corev1.Pod {
				p := chainPod(plain, "", "10.0.0.2")
				p.OwnerReferences[0].UID = "u-other"
				return p
			}(), base,
			want{link: LinkSandbox}},
		{"a hand-made pod owned by a claimed Sandbox that names another pod's address is refused",
			chainPod(claimed, coding, "10.0.0.66"), base, want{link: LinkPod}},
		{"a pod with one of the Sandbox's addresses but not all is refused",
			chainPod(plain, "", "10.0.0.2", "fd00::9"), base, want{link: LinkPod}},
		{"a pod whose name-hash label is not its Sandbox's is refused",
			func() *corev1.Pod {
				p := chainPod(plain, "", "10.0.0.2")
				p.Labels[identity.LabelSandboxNameHash] = "x"
				return p
			}(), base,
			want{link: LinkPod}},
		{"a pod the Sandbox names no address of yet waits (the controller clears them for two pods)",
			chainPod(plain, "", "10.0.0.2"), base.with("sandbox/plain", chainSandbox("plain", "", "", "", "")),
			want{link: LinkPod, transient: true}},

		{"a Sandbox its warm pool still controls is unknown: nothing the controller writes lists a pool's members",
			chainPod(chainSandbox("wp-coding-abcde", "coding-agent", KindSandboxWarmPool, "wp-coding", "u-pool", "10.0.0.4"), coding, "10.0.0.4"),
			base.with("sandbox/wp-coding-abcde", chainSandbox("wp-coding-abcde", "coding-agent", KindSandboxWarmPool, "wp-coding", "u-pool", "10.0.0.4")),
			want{link: LinkWarmPool, transient: true}},
		{"a Sandbox pointing at a claim bound to another sandbox is refused",
			chainPod(chainSandbox("intruder", "", KindSandboxClaim, "task-2", "u-claim", "10.0.0.5"), coding, "10.0.0.5"),
			base.with("sandbox/intruder", chainSandbox("intruder", "", KindSandboxClaim, "task-2", "u-claim", "10.0.0.5")),
			want{link: LinkClaim}},
		{"a claim not bound yet gives nothing, without a warning",
			chainPod(claimed, coding, "10.0.0.1"), base.with("claim/task-2", claim("")), want{link: LinkClaim, transient: true}},
		{"an ownerReference with another UID than the claim's is refused",
			chainPod(chainSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-other", "10.0.0.1"), coding, "10.0.0.1"),
			base.with("sandbox/wp-coding-x7k2q", chainSandbox("wp-coding-x7k2q", "coding-agent", KindSandboxClaim, "task-2", "u-other", "10.0.0.1")),
			want{link: LinkClaim}},
		{"a claim that does not exist is refused",
			chainPod(claimed, coding, "10.0.0.1"), base.with("claim/task-2", nil), want{link: LinkClaim}},
		{"with the claim's warm pool gone the template cannot be verified (annotation and labels are the creator's)",
			chainPod(claimed, coding, "10.0.0.1"), base.with("pool/wp-coding", nil), want{link: LinkWarmPool}},
		{"an annotation naming another template than the claim's pool is refused",
			chainPod(claimed, coding, "10.0.0.1"),
			base.with("sandbox/wp-coding-x7k2q", chainSandbox("wp-coding-x7k2q", "admin-agent", KindSandboxClaim, "task-2", "u-claim", "10.0.0.1")),
			want{link: LinkTemplate}},
		{"a claimed Sandbox without its template annotation is refused: it records what the Sandbox was built from",
			chainPod(claimed, coding, "10.0.0.1"),
			base.with("sandbox/wp-coding-x7k2q", chainSandbox("wp-coding-x7k2q", "", KindSandboxClaim, "task-2", "u-claim", "10.0.0.1")),
			want{link: LinkTemplate}},
		{"a pod without the template hash of its claim's pool is refused",
			chainPod(claimed, "", "10.0.0.1"), base, want{link: LinkTemplate}},
		{"a pod hash of another template than the claim's pool is refused",
			chainPod(claimed, identity.NameHash("admin-agent"), "10.0.0.1"), base, want{link: LinkTemplate}},
		{"a template hash on the pod of a Sandbox no claim controls is refused",
			chainPod(plain, coding, "10.0.0.2"), base, want{link: LinkTemplate}},
		{"a template annotation on a Sandbox no claim controls is refused",
			chainPod(chainSandbox("plain", "coding-agent", "", "", "", "10.0.0.2"), "", "10.0.0.2"),
			base.with("sandbox/plain", chainSandbox("plain", "coding-agent", "", "", "", "10.0.0.2")), want{link: LinkTemplate}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := verify(tc.pod, podAddrs(tc.pod), tc.objs)
			assert.Equal(t, tc.want, want{template: v.template, claim: v.claim, link: v.link, transient: v.transient})
			if tc.want.link == Verified {
				assert.Equal(t, tc.pod.OwnerReferences[0].Name, v.sandbox)
			}
		})
	}
}

func TestLinkUnverified(t *testing.T) {
	assert.Empty(t, Verified.Unverified())
	assert.Equal(t, "identity_unverified:pod", LinkPod.Unverified())
}

func TestNameHash(t *testing.T) {
	// Values of the upstream controller's NameHash (FNV-1a 32, eight hex digits).
	assert.Equal(t, "811c9dc5", identity.NameHash(""))
	assert.Len(t, identity.NameHash("coding-agent"), 8)
}

func TestSameAddrs(t *testing.T) {
	a := []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	assert.True(t, sameAddrs([]string{"10.0.0.1"}, a))
	assert.True(t, sameAddrs([]string{"::ffff:10.0.0.1"}, a), "IPv4-mapped is the same address")
	assert.False(t, sameAddrs([]string{"10.0.0.1", "10.0.0.2"}, a))
	assert.False(t, sameAddrs([]string{"not-an-ip"}, a))
}
