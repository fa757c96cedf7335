package kubetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/internal/identity"
)

func TestStart(t *testing.T) {
	c := Start(t)
	admin, adminDyn := Clients(t, c.Admin)
	user, userDyn := Clients(t, c.Sandgate)
	ctx := context.Background()

	t.Run("the apiserver reports the built version", func(t *testing.T) {
		v, err := admin.Discovery().ServerVersion()
		require.NoError(t, err)
		assert.Equal(t, "v1.37.2", v.GitVersion)
	})
	t.Run("the upstream CRDs are served", func(t *testing.T) {
		Namespace(t, admin, "agents", nil)
		tpl := Template(t, adminDyn, "agents", "coder", "")
		mode, _, _ := unstructured.NestedString(tpl.Object, "spec", "networkPolicyManagement")
		assert.Equal(t, "Managed", mode, "the CRD defaults networkPolicyManagement")
	})
	t.Run("the upstream schema refuses what the hand-written CRDs let through", func(t *testing.T) {
		for name, obj := range map[string]map[string]any{
			"a claim without warmPoolRef": {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
				"metadata": map[string]any{"name": "no-pool"}, "spec": map[string]any{"sandboxTemplateRef": map[string]any{"name": "coder"}}},
			"a template without containers": {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
				"metadata": map[string]any{"name": "empty"}, "spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{}}}},
		} {
			gvr := SandboxClaimGVR
			if obj["kind"] == "SandboxTemplate" {
				gvr = SandboxTemplateGVR
			}
			_, err := adminDyn.Resource(gvr).Namespace("agents").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
			assert.True(t, apierrors.IsInvalid(err), "%s: %v", name, err)
		}
	})
	t.Run("RBAC is enforced: the sandgate user starts with no permission", func(t *testing.T) {
		_, err := user.CoreV1().Pods("agents").List(ctx, metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		_, err = userDyn.Resource(SandboxGVR).Namespace("agents").List(ctx, metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
	})
	t.Run("a bound Role grants exactly its rules", func(t *testing.T) {
		BindRules(t, admin, "agents", SandgateUser, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}})
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			_, err := user.CoreV1().Pods("agents").List(ctx, metav1.ListOptions{})
			assert.NoError(ct, err)
		}, 10*time.Second, 50*time.Millisecond)
		_, err := user.CoreV1().Pods("agents").Get(ctx, "x", metav1.GetOptions{})
		assert.True(t, apierrors.IsForbidden(err), "get is not granted: %v", err)
	})
	t.Run("pod IPs are set through the status subresource", func(t *testing.T) {
		WarmPool(t, adminDyn, "agents", "coder-pool", "coder", 0)
		sb := Sandbox(t, adminDyn, "agents", "sb", "coder", Claim(t, adminDyn, "agents", "claim", "coder-pool"))
		SandboxPod(t, admin, sb, "sb-pod", nil)
		SetPodIPs(t, admin, "agents", "sb-pod", "10.1.2.3")
		p, err := admin.CoreV1().Pods("agents").Get(ctx, "sb-pod", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "10.1.2.3", p.Status.PodIP)
	})
}

// TestController runs the upstream controller: a claim on a warm pool adopts the pool's sandbox,
// which keeps the pool's name, and its pod carries the template-ref-hash label.
func TestController(t *testing.T) {
	c := Start(t)
	c.StartController(t)
	admin, adminDyn := Clients(t, c.Admin)
	ctx := context.Background()
	Namespace(t, admin, "agents", nil)
	Template(t, adminDyn, "agents", "coder", "Unmanaged")
	WarmPool(t, adminDyn, "agents", "wp-coder", "coder", 1)

	var pooled string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		l, err := adminDyn.Resource(SandboxGVR).Namespace("agents").List(ctx, metav1.ListOptions{})
		require.NoError(ct, err)
		require.Len(ct, l.Items, 1)
		pooled = l.Items[0].GetName()
	}, 60*time.Second, 100*time.Millisecond, "the warm pool creates its sandbox")
	assert.Contains(t, pooled, "wp-coder")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, err := admin.CoreV1().Pods("agents").Get(ctx, pooled, metav1.GetOptions{})
		assert.NoError(ct, err)
	}, 60*time.Second, 100*time.Millisecond, "the controller creates the pool's pod")
	// A candidate is adopted only once it has an address (else the claim falls back to a cold
	// sandbox named after itself).
	SetPodIPs(t, admin, "agents", pooled, "10.1.2.3")

	Claim(t, adminDyn, "agents", "task-2", "wp-coder")
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		cl, err := adminDyn.Resource(SandboxClaimGVR).Namespace("agents").Get(ctx, "task-2", metav1.GetOptions{})
		require.NoError(ct, err)
		name, _, _ := unstructured.NestedString(cl.Object, "status", "sandbox", "name")
		assert.Equal(ct, pooled, name, "the claim adopts the pool's sandbox under its own name")
	}, 60*time.Second, 100*time.Millisecond)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		pods, err := admin.CoreV1().Pods("agents").List(ctx, metav1.ListOptions{})
		require.NoError(ct, err)
		require.NotEmpty(ct, pods.Items)
		for _, p := range pods.Items {
			assert.Equal(ct, identity.NameHash("coder"), p.Labels[identity.LabelTemplateRefHash], "pod %s", p.Name)
		}
	}, 60*time.Second, 100*time.Millisecond)
}
