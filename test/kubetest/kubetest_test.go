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
	t.Run("the test CRDs are served", func(t *testing.T) {
		Namespace(t, admin, "agents", nil)
		tpl := Template(t, adminDyn, "agents", "coder", "")
		mode, _, _ := unstructured.NestedString(tpl.Object, "spec", "networkPolicyManagement")
		assert.Equal(t, "Managed", mode, "the CRD defaults networkPolicyManagement")
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
		sb := Sandbox(t, adminDyn, "agents", "sb", "coder", Claim(t, adminDyn, "agents", "claim", "coder"))
		SandboxPod(t, admin, sb, "sb-pod", nil)
		SetPodIPs(t, admin, "agents", "sb-pod", "10.1.2.3")
		p, err := admin.CoreV1().Pods("agents").Get(ctx, "sb-pod", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "10.1.2.3", p.Status.PodIP)
	})
}
