package deploy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/test/kubetest"
)

// The chart's identity admission policies on a real kube-apiserver beside the upstream Agent
// Sandbox controller: a tenant of the sandbox namespace (every verb on pods, Sandboxes and
// claims) is refused each forgery of issue 34, while the controller, running as its
// ServiceAccount, still serves claims from a warm pool, and the tenant's ordinary work is let
// through. (internal/identity/kubeid's TestForgeriesWithoutAdmissionPolicy plays the same forgeries
// with the policies off: Sandgate resolves each forger as an unknown caller.)
func TestIdentityPolicyRefusesForgeries(t *testing.T) {
	helmBin(t)
	cluster := kubetest.Start(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	tenant, tenantDyn := kubetest.Clients(t, cluster.Tenant)
	_, ctlDyn := kubetest.Clients(t, cluster.Controller)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mapper := newMapper(t, cs)
	const ns = "sandboxes"

	objs := render(t, chartCase{name: "default"}, "sandgate", "sandgate")
	policies := append(find(objs, "ValidatingAdmissionPolicy"), find(objs, "ValidatingAdmissionPolicyBinding")...)
	require.Len(t, policies, 6, "template rules, identity, host namespaces: each with its binding")
	ensureNamespace(t, ctx, cs, ns)
	for _, o := range policies {
		if !strings.HasSuffix(o.GetName(), "-template-rules") { // templates' rules: TestAdmissionPolicyOnRealAPIServer
			apply(t, ctx, dyn, mapper, o)
		}
	}
	kubetest.BindRules(t, cs, ns, kubetest.TenantUser, kubetest.TenantRules())
	cluster.StartController(t)

	reserved := func(generateName string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: generateName, Namespace: ns,
			Labels: map[string]string{identity.LabelSandboxNameHash: identity.NameHash("anything")}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "example.invalid/x:1"}}}}
	}
	require.Eventually(t, func() bool {
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, reserved("probe-"), metav1.CreateOptions{})
		return apierrors.IsForbidden(err)
	}, 30*time.Second, 100*time.Millisecond, "the identity policy is not enforced")

	// The controller's own flow, under the policy: a pool's sandbox, its pod, a claim adopting it.
	kubetest.Template(t, ctlDyn, ns, "coding-agent", "Unmanaged")
	pool := kubetest.WarmPool(t, ctlDyn, ns, "wp-coding", "coding-agent", 1)
	pooled := waitFor(t, func() string {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return ""
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, "wp-coding-") {
				return p.Name
			}
		}
		return ""
	})
	kubetest.SetPodIPs(t, cs, ns, pooled, "10.4.0.1")
	kubetest.Claim(t, tenantDyn, ns, "task-1", "wp-coding")
	waitFor(t, func() string {
		cl, err := tenantDyn.Resource(kubetest.SandboxClaimGVR).Namespace(ns).Get(ctx, "task-1", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		name, _, _ := unstructured.NestedString(cl.Object, "status", "sandbox", "name")
		return name
	})
	claimed, err := tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Get(ctx, pooled, metav1.GetOptions{})
	require.NoError(t, err)
	yes := true
	refOf := func(o *unstructured.Unstructured) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Name: o.GetName(), UID: o.GetUID(), Controller: &yes}
	}
	sandbox := func(name string, spec map[string]any) *unstructured.Unstructured {
		if spec == nil {
			spec = map[string]any{"containers": []any{map[string]any{"name": "agent", "image": "example.invalid/agent:1"}}}
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"podTemplate": map[string]any{"spec": spec}}}}
	}
	refused := func(t *testing.T, err error, says ...string) {
		t.Helper()
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		for _, s := range says {
			assert.Contains(t, err.Error(), s)
		}
	}

	t.Run("1. a Sandbox with a controller ownerReference to a warm pool is refused", func(t *testing.T) {
		sb := sandbox("forged-member", nil)
		sb.SetOwnerReferences([]metav1.OwnerReference{refOf(pool)})
		_, err := tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Create(ctx, sb, metav1.CreateOptions{})
		refused(t, err, "only the Agent Sandbox controller may set ownerReferences", "SandboxWarmPool wp-coding", "Create a SandboxClaim")
	})
	t.Run("1. nor may a tenant give a Sandbox of its own to the pool later", func(t *testing.T) {
		_, err := tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Create(ctx, sandbox("own", nil), metav1.CreateOptions{})
		require.NoError(t, err, "a plain Sandbox is the tenant's to create")
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []any{refOf(pool)}}})
		_, err = tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Patch(ctx, "own", types.MergePatchType, patch, metav1.PatchOptions{})
		refused(t, err, "ownerReferences")
	})
	t.Run("2. a hand-made pod owned by a claimed Sandbox is refused", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "forged-pod", Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{refOf(claimed)}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "example.invalid/x:1"}}}}
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		refused(t, err, "Sandbox "+pooled)
	})
	t.Run("2. so is a pod carrying the controller's labels", func(t *testing.T) {
		p := reserved("forged-labels-")
		p.Labels[identity.LabelTemplateRefHash] = identity.NameHash("coding-agent")
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		refused(t, err, identity.LabelSandboxNameHash, identity.LabelTemplateRefHash)
	})
	for what, meta := range map[string]map[string]any{
		"label":      {"labels": map[string]any{identity.LabelTemplateRefHash: identity.NameHash("admin-agent")}},
		"annotation": {"annotations": map[string]any{identity.AnnotationTemplateRef: "admin-agent"}},
	} {
		t.Run("3. editing a claimed Sandbox's template "+what+" is refused", func(t *testing.T) {
			patch, _ := json.Marshal(map[string]any{"metadata": meta})
			_, err := tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Patch(ctx, pooled, types.MergePatchType, patch, metav1.PatchOptions{})
			refused(t, err, "agents.x-k8s.io/sandbox-template-ref")
		})
	}
	t.Run("7. host namespaces are refused in templates and Sandboxes, whoever writes them, saying why", func(t *testing.T) {
		for _, field := range []string{"hostNetwork", "hostPID", "hostIPC"} {
			spec := map[string]any{field: true, "containers": []any{map[string]any{"name": "agent", "image": "example.invalid/agent:1"}}}
			tpl := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
				"metadata": map[string]any{"name": "host-" + strings.ToLower(field), "namespace": ns},
				"spec":     map[string]any{"networkPolicyManagement": "Unmanaged", "podTemplate": map[string]any{"spec": spec}}}}
			_, err := ctlDyn.Resource(kubetest.SandboxTemplateGVR).Namespace(ns).Create(ctx, tpl, metav1.CreateOptions{})
			refused(t, err, "sets "+field, "Sandgate identifies a sandbox by its pod's address")
			_, err = tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Create(ctx, sandbox("host-"+strings.ToLower(field), spec), metav1.CreateOptions{})
			refused(t, err, "sets "+field)
		}
	})

	t.Run("a tenant's ordinary work is let through", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ci-job", Namespace: ns, Labels: map[string]string{"app": "ci"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "example.invalid/x:1"}}}}
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		require.NoError(t, err, "a pod of its own")
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{"team": "red", "agents.x-k8s.io/created-by": "python-client"}}})
		_, err = tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Patch(ctx, pooled, types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err, "its own labels on a claimed Sandbox, the controller's left as they are")
		_, err = tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Patch(ctx, pooled, types.JSONPatchType,
			[]byte(`[{"op":"remove","path":"/metadata/ownerReferences"}]`), metav1.PatchOptions{})
		require.NoError(t, err, "removing an ownerReference (the garbage collector orphans that way)")
	})
}

// waitFor polls f until it returns a non-empty string, and returns it.
func waitFor(t *testing.T, f func() string) string {
	t.Helper()
	var got string
	require.Eventually(t, func() bool { got = f(); return got != "" }, 60*time.Second, 100*time.Millisecond)
	return got
}
