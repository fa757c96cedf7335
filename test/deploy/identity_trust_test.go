package deploy

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/identity/kubeid"
	"github.com/sandgate/sandgate/test/kubetest"
)

// What identity rests on, asked of each fact: who can remove or change it? On each supported
// Agent Sandbox release, beside its controller, a tenant of the sandbox namespaces (every verb on
// pods, Sandboxes and claims; read on pools and templates) removes and changes every fact the
// resolver reads of a claimed sandbox, once in a namespace the chart's identity policy guards and,
// for what only the policy refuses, once in one it does not. Each request is refused by RBAC, the
// policy or the apiserver's validation as docs/kubernetes.md's table says, or it leaves the sandbox
// itself or an unknown caller naming the link; never another sandbox, template or claim. The
// controller is stopped while the tenant acts, so that what Sandgate reads is the tenant's doing;
// its own rewrites are played in the re-pointed pool below (issue 59's case), where the only
// record left of the template a pod was built from is an annotation a tenant may delete.
func TestWhoCanRemoveOrChangeWhatIdentityRestsOn(t *testing.T) {
	helmBin(t)
	for _, release := range kubetest.Releases() {
		t.Run(release.Version, func(t *testing.T) {
			rig := newIdentityRig(t, release)
			targets := rig.factTargets(t)
			decoys := map[string]decoys{guarded: rig.decoys(t, guarded), open: rig.decoys(t, open)}
			repointed := rig.claimed(t, guarded, "repointed", "wp-repoint", templateA)
			reclaimed := rig.claimed(t, guarded, "reclaimed", "wp-a", templateA)
			marker := rig.plainSandbox(t, guarded, "marker")
			rig.stopController()

			for _, tg := range targets {
				t.Run(tg.ns+": "+tg.c.fact+", "+tg.c.op, func(t *testing.T) {
					rig.check(t, tg.s, tg.c.do(rig, tg.s, decoys[tg.ns]), tg.want)
				})
			}
			t.Run("a pod built from one template never resolves as the one its pool or claim was re-pointed to", func(t *testing.T) {
				rig.repoint(t, repointed, reclaimed, marker)
			})
		})
	}
}

// factTarget is one factCase in one namespace, with the sandbox it is played on.
type factTarget struct {
	c    factCase
	ns   string
	want outcome
	s    sandboxUnderTest
}

// factTargets claims a sandbox for every request the apiserver lets through (it changes that
// sandbox for good), and one per namespace for all the refused ones.
func (rig *identityRig) factTargets(t *testing.T) []factTarget {
	t.Helper()
	shared := map[string]sandboxUnderTest{}
	var out []factTarget
	for i, c := range factCases() {
		for _, ns := range []string{guarded, open} {
			tg := factTarget{c: c, ns: ns, want: c.guarded}
			if ns == open {
				if c.guarded.refusedBy != byPolicy {
					continue // the same in both: only the policy tells them apart
				}
				tg.want = c.open
			}
			if tg.want.refusedBy != byNobody {
				if _, ok := shared[ns]; !ok {
					shared[ns] = rig.claimed(t, ns, "refused", "wp-a", templateA)
				}
				tg.s = shared[ns]
			} else {
				tg.s = rig.claimed(t, ns, fmt.Sprintf("fact-%d", i), "wp-a", templateA)
			}
			out = append(out, tg)
		}
	}
	return out
}

// decoys makes what a tenant could point a sandbox's ownerReferences at in ns: a Sandbox of its
// own and another claim.
func (rig *identityRig) decoys(t *testing.T, ns string) decoys {
	t.Helper()
	yes := true
	ref := func(gvr schema.GroupVersionResource, name string) metav1.OwnerReference {
		obj, err := rig.adminDyn.Resource(gvr).Namespace(ns).Get(rig.ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		return metav1.OwnerReference{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Name: obj.GetName(), UID: obj.GetUID(), Controller: &yes}
	}
	return decoys{
		sandboxRef: ref(kubetest.SandboxGVR, rig.plainSandbox(t, ns, "decoy-sandbox").sandbox),
		claimRef:   ref(kubetest.SandboxClaimGVR, rig.claimed(t, ns, "decoy-claim", "wp-b", templateB).claim),
	}
}

// repoint plays issue 59's case, with the controller stopped at first: an administrator
// re-points the warm pool of repointed from template A to B, and the tenant re-points its own
// claim reclaimed to a pool of B; a controller restart relabels both Sandboxes and their pods
// with B's hash; the tenant then removes the template annotation of both, the one fact left that
// names A, which the identity policy lets it do. Neither may then resolve as B.
func (rig *identityRig) repoint(t *testing.T, repointed, reclaimed, marker sandboxUnderTest) {
	t.Helper()
	hashB := identity.NameHash(templateB)
	_, err := rig.adminDyn.Resource(kubetest.SandboxWarmPoolGVR).Namespace(guarded).Patch(rig.ctx, "wp-repoint", types.MergePatchType,
		mergePatch(map[string]any{"spec": map[string]any{"sandboxTemplateRef": map[string]any{"name": templateB}}}), metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, rig.patchClaim(reclaimed, types.MergePatchType,
		mergePatch(map[string]any{"spec": map[string]any{"warmPoolRef": map[string]any{"name": "wp-b"}}})), "the tenant may re-point its claim")
	for _, s := range []sandboxUnderTest{repointed, reclaimed} {
		rig.eventuallyUnknown(t, s, kubeid.LinkTemplate)
	}

	rig.stopController = rig.cluster.StartController(t) // the routine restart
	for _, s := range []sandboxUnderTest{repointed, reclaimed} {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			sb, err := rig.adminDyn.Resource(kubetest.SandboxGVR).Namespace(s.ns).Get(rig.ctx, s.sandbox, metav1.GetOptions{})
			require.NoError(c, err)
			assert.Equal(c, hashB, sb.GetLabels()[identity.LabelTemplateRefHash], "the controller relabels the Sandbox")
			assert.Equal(c, templateA, sb.GetAnnotations()[identity.AnnotationTemplateRef], "and leaves the record of its template")
			pod, err := rig.admin.CoreV1().Pods(s.ns).Get(rig.ctx, s.pod, metav1.GetOptions{})
			require.NoError(c, err)
			assert.Equal(c, hashB, pod.Labels[identity.LabelTemplateRefHash], "and its pod")
		}, 90*time.Second, 100*time.Millisecond, "the controller relabels %s to template %s", s.sandbox, templateB)
		rig.eventuallyUnknown(t, s, kubeid.LinkTemplate)
	}
	rig.stopController()

	for _, s := range []sandboxUnderTest{repointed, reclaimed} {
		require.NoError(t, rig.patchSandbox(s, types.MergePatchType, withAnnotation(identity.AnnotationTemplateRef, nil)),
			"the identity policy lets a tenant remove the annotation")
	}
	// The deletion of the marker comes through the same watch as the edits above, after them:
	// once Sandgate has seen it, it has seen them.
	require.NoError(t, rig.tenantDyn.Resource(kubetest.SandboxGVR).Namespace(guarded).Delete(rig.ctx, marker.sandbox, metav1.DeleteOptions{}))
	rig.eventuallyUnknown(t, marker, kubeid.LinkSandbox)
	for _, s := range []sandboxUnderTest{repointed, reclaimed} {
		got := rig.resolver.Resolve(s.ip)
		assert.False(t, got.Known, "%s was built from %s: it is not %s", s.sandbox, templateA, got.Template)
		assert.Equal(t, kubeid.LinkTemplate.Unverified(), got.Unverified)
		assert.Empty(t, got.Template)
	}
}

// eventuallyUnknown waits until s's address is an unknown caller whose event names link.
func (rig *identityRig) eventuallyUnknown(t *testing.T, s sandboxUnderTest, link kubeid.Link) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := rig.resolver.Resolve(s.ip)
		assert.False(c, got.Known)
		assert.Equal(c, link.Unverified(), got.Unverified)
	}, 60*time.Second, 50*time.Millisecond, "%s/%s is not an unknown caller at %s", s.ns, s.sandbox, link)
}
