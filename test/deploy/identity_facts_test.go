package deploy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/identity/kubeid"
	"github.com/sandgate/sandgate/test/kubetest"
)

// Who refuses a tenant's request, in a factCase.
const (
	byNobody = ""
	byRBAC   = "RBAC"   // the tenant holds no such permission (status subresources, pools)
	byPolicy = "policy" // the chart's identity admission policy
	bySchema = "schema" // the apiserver's validation (immutable or required fields)
)

// outcome is what one tenant request comes to: who refused it, or what Sandgate then makes of
// the sandbox's address.
type outcome struct {
	refusedBy string
	link      kubeid.Link // allowed: the link the unknown caller's event names
	unmapped  bool        // allowed: the address maps to no sandbox pod at all
	own       bool        // allowed: still the sandbox itself (what it may change is its own)
}

func refusedBy(who string) outcome    { return outcome{refusedBy: who} }
func unknownAt(l kubeid.Link) outcome { return outcome{link: l} }

// factCase is a tenant's request against one fact Sandgate reads of a sandbox: in the namespace
// the identity policy guards, and (for what only the policy refuses) in one it does not.
type factCase struct {
	fact, op      string
	do            func(rig *identityRig, s sandboxUnderTest, decoys decoys) error
	guarded, open outcome
}

// decoys are objects of a namespace a tenant may point a sandbox's facts at.
type decoys struct {
	sandboxRef, claimRef metav1.OwnerReference // a plain Sandbox of the tenant's, another claim
}

func remove(field ...string) []byte {
	return []byte(fmt.Sprintf(`[{"op":"remove","path":"/%s"}]`, strings.Join(field, "/")))
}

func withLabel(k string, v any) []byte {
	return mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]any{k: v}}})
}

func withAnnotation(k string, v any) []byte {
	return mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: v}}})
}

func withOwner(ref metav1.OwnerReference) []byte {
	return mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []any{ref}}})
}

func (rig *identityRig) patchPod(s sandboxUnderTest, pt types.PatchType, body []byte, sub ...string) error {
	_, err := rig.tenant.CoreV1().Pods(s.ns).Patch(rig.ctx, s.pod, pt, body, metav1.PatchOptions{}, sub...)
	return err
}

func (rig *identityRig) patchSandbox(s sandboxUnderTest, pt types.PatchType, body []byte, sub ...string) error {
	_, err := rig.tenantDyn.Resource(kubetest.SandboxGVR).Namespace(s.ns).Patch(rig.ctx, s.sandbox, pt, body, metav1.PatchOptions{}, sub...)
	return err
}

func (rig *identityRig) patchClaim(s sandboxUnderTest, pt types.PatchType, body []byte, sub ...string) error {
	_, err := rig.tenantDyn.Resource(kubetest.SandboxClaimGVR).Namespace(s.ns).Patch(rig.ctx, s.claim, pt, body, metav1.PatchOptions{}, sub...)
	return err
}

// factCases: every fact the resolver reads of a claimed sandbox (internal/identity/kubeid's
// verify and identityOf), each removed and changed by a tenant as far as the apiserver lets it
// (docs/kubernetes.md, "What identity rests on", has the same rows).
func factCases() []factCase {
	merge, jsonPatch := types.MergePatchType, types.JSONPatchType
	hashB := identity.NameHash(templateB)
	return []factCase{
		{"pod status.podIPs", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, mergePatch(map[string]any{"status": map[string]any{"podIP": "10.99.0.1", "podIPs": []any{map[string]any{"ip": "10.99.0.1"}}}}), "status")
		}, refusedBy(byRBAC), outcome{}},
		{"pod label " + identity.LabelSandboxNameHash, "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, withLabel(identity.LabelSandboxNameHash, nil))
		}, outcome{unmapped: true}, outcome{}},
		{"pod label " + identity.LabelSandboxNameHash, "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, withLabel(identity.LabelSandboxNameHash, identity.NameHash("another")))
		}, refusedBy(byPolicy), unknownAt(kubeid.LinkPod)},
		{"pod controlling ownerReference (its Sandbox)", "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, jsonPatch, remove("metadata", "ownerReferences"))
		}, unknownAt(kubeid.LinkSandbox), outcome{}},
		{"pod controlling ownerReference (its Sandbox)", "change", func(rig *identityRig, s sandboxUnderTest, d decoys) error {
			return rig.patchPod(s, merge, withOwner(d.sandboxRef))
		}, refusedBy(byPolicy), unknownAt(kubeid.LinkPod)},
		{"pod label " + identity.LabelTemplateRefHash, "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, withLabel(identity.LabelTemplateRefHash, nil))
		}, unknownAt(kubeid.LinkTemplate), outcome{}},
		{"pod label " + identity.LabelTemplateRefHash, "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, withLabel(identity.LabelTemplateRefHash, hashB))
		}, refusedBy(byPolicy), unknownAt(kubeid.LinkTemplate)},
		{"pod spec.hostNetwork", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, mergePatch(map[string]any{"spec": map[string]any{"hostNetwork": true}}))
		}, refusedBy(bySchema), outcome{}},
		{"pod labels outside the Agent Sandbox prefixes", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchPod(s, merge, withLabel("team", "admins"))
		}, outcome{own: true}, outcome{}},
		{"Sandbox status.podIPs", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchSandbox(s, merge, mergePatch(map[string]any{"status": map[string]any{"podIPs": []any{"10.99.0.2"}}}), "status")
		}, refusedBy(byRBAC), outcome{}},
		{"the Sandbox", "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.tenantDyn.Resource(kubetest.SandboxGVR).Namespace(s.ns).Delete(rig.ctx, s.sandbox, metav1.DeleteOptions{})
		}, unknownAt(kubeid.LinkSandbox), outcome{}},
		{"Sandbox controlling ownerReference (its claim)", "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchSandbox(s, jsonPatch, remove("metadata", "ownerReferences"))
		}, unknownAt(kubeid.LinkTemplate), outcome{}},
		{"Sandbox controlling ownerReference (its claim)", "change", func(rig *identityRig, s sandboxUnderTest, d decoys) error {
			return rig.patchSandbox(s, merge, withOwner(d.claimRef))
		}, refusedBy(byPolicy), unknownAt(kubeid.LinkClaim)},
		{"Sandbox annotation " + identity.AnnotationTemplateRef, "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchSandbox(s, merge, withAnnotation(identity.AnnotationTemplateRef, nil))
		}, unknownAt(kubeid.LinkTemplate), outcome{}},
		{"Sandbox annotation " + identity.AnnotationTemplateRef, "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchSandbox(s, merge, withAnnotation(identity.AnnotationTemplateRef, templateB))
		}, refusedBy(byPolicy), unknownAt(kubeid.LinkTemplate)},
		{"claim status.sandbox.name", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchClaim(s, merge, mergePatch(map[string]any{"status": map[string]any{"sandbox": map[string]any{"name": "another"}}}), "status")
		}, refusedBy(byRBAC), outcome{}},
		{"the claim", "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.tenantDyn.Resource(kubetest.SandboxClaimGVR).Namespace(s.ns).Delete(rig.ctx, s.claim, metav1.DeleteOptions{})
		}, unknownAt(kubeid.LinkClaim), outcome{}},
		{"claim spec.warmPoolRef", "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchClaim(s, jsonPatch, remove("spec", "warmPoolRef"))
		}, refusedBy(bySchema), outcome{}},
		{"claim spec.warmPoolRef", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.patchClaim(s, merge, mergePatch(map[string]any{"spec": map[string]any{"warmPoolRef": map[string]any{"name": "wp-b"}}}))
		}, unknownAt(kubeid.LinkTemplate), outcome{}},
		{"the warm pool", "remove", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			return rig.tenantDyn.Resource(kubetest.SandboxWarmPoolGVR).Namespace(s.ns).Delete(rig.ctx, "wp-a", metav1.DeleteOptions{})
		}, refusedBy(byRBAC), outcome{}},
		{"warm pool spec.sandboxTemplateRef", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			_, err := rig.tenantDyn.Resource(kubetest.SandboxWarmPoolGVR).Namespace(s.ns).Patch(rig.ctx, "wp-a", merge,
				mergePatch(map[string]any{"spec": map[string]any{"sandboxTemplateRef": map[string]any{"name": templateB}}}), metav1.PatchOptions{})
			return err
		}, refusedBy(byRBAC), outcome{}},
		{"SandboxTemplate", "change", func(rig *identityRig, s sandboxUnderTest, _ decoys) error {
			_, err := rig.tenantDyn.Resource(kubetest.SandboxTemplateGVR).Namespace(s.ns).Patch(rig.ctx, templateA, merge,
				mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]any{"team": "admins"}}}), metav1.PatchOptions{})
			return err
		}, refusedBy(byRBAC), outcome{}},
	}
}

// check asserts that err is the refusal want names, or, for an allowed request, that Sandgate
// comes to resolve s as want says and never as another sandbox, template or claim.
func (rig *identityRig) check(t *testing.T, s sandboxUnderTest, err error, want outcome) {
	t.Helper()
	switch want.refusedBy {
	case byRBAC, byPolicy:
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		assert.Equal(t, want.refusedBy == byPolicy, strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), "refused by %s: %v", want.refusedBy, err)
	case bySchema:
		require.Error(t, err)
		assert.True(t, apierrors.IsInvalid(err), "%v", err)
	default:
		require.NoError(t, err, "the apiserver lets the tenant do it")
	}
	if want.refusedBy != byNobody {
		got := rig.resolver.Resolve(s.ip)
		got.Labels = nil
		assert.Equal(t, s.own(), got, "nothing changed: the sandbox is itself")
		return
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := rig.resolver.Resolve(s.ip)
		switch {
		case want.own:
			assert.Equal(c, "admins", got.Labels["team"], "its own labels are the sandbox's to set")
			got.Labels = nil
			assert.Equal(c, s.own(), got)
		case want.unmapped:
			assert.False(c, got.Known)
			assert.Empty(c, got.Unverified, "no sandbox pod has the address")
		default:
			assert.False(c, got.Known)
			assert.Equal(c, want.link.Unverified(), got.Unverified)
		}
	}, 60*time.Second, 50*time.Millisecond)
	if got := rig.resolver.Resolve(s.ip); !want.own {
		assert.Equal(t, "anonymous", got.Key(), "an unknown caller carries no sandbox")
		assert.Empty(t, got.Template)
		assert.Empty(t, got.Claim)
	}
}
