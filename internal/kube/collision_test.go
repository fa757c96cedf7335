package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/test/kubetest"
)

// startController creates RBAC()'s objects for the sandgate user and runs a controller for cfg
// as that user until the test ends.
func startController(t *testing.T, cluster *kubetest.Cluster, cfg config.Kubernetes) *Controller {
	t.Helper()
	admin, _ := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithCancel(context.Background())
	for _, obj := range RBAC(cfg, RBACSubject{Kind: rbacv1.UserKind, Name: kubetest.SandgateUser}) {
		var err error
		switch o := obj.(type) {
		case *rbacv1.Role:
			_, err = admin.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		require.NoError(t, err)
	}
	client, dyn := kubetest.Clients(t, cluster.Sandgate)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := NewController(client, dyn, cfg, logger, prometheus.NewRegistry())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// afterReconciles touches template name (a label) n times, each time waiting until the
// controller has finished one more reconcile: a sync point that needs no sleep.
func afterReconciles(t *testing.T, c *Controller, dyn dynamic.Interface, name string, n int) {
	t.Helper()
	for i := range n {
		before := testutil.ToFloat64(c.reconciles.WithLabelValues("ok"))
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"touch":"%d"}}}`, i)
		_, err := dyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return testutil.ToFloat64(c.reconciles.WithLabelValues("ok")) > before },
			20*time.Second, 20*time.Millisecond, "reconcile %d", i)
	}
}

func policyVersion(t *testing.T, cs kubernetes.Interface, name string) string {
	t.Helper()
	np, err := cs.NetworkingV1().NetworkPolicies("sandboxes").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return np.ResourceVersion
}

// TestControllerNeverTakesTurnsAtOneName: two Unmanaged templates whose long names share the
// 32-bit template hash get a policy each, and nothing is rewritten once they converge; a
// template whose policy name is held by another template's is refused (event, metric), not
// applied in turns.
func TestControllerNeverTakesTurnsAtOneName(t *testing.T) {
	cluster := kubetest.Start(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	setupNamespaces(t, admin)
	cfg := testConfig(true)
	cfg.Controller.Resync = 0
	c := startController(t, cluster, cfg)
	rules := SandboxRules(cfg)

	t.Run("two long names of one 32-bit hash get two policies that stay put", func(t *testing.T) {
		kubetest.Template(t, adminDyn, "sandboxes", collidingA, Unmanaged)
		kubetest.Template(t, adminDyn, "sandboxes", collidingB, Unmanaged)
		names := []string{TemplatePolicyName(collidingA), TemplatePolicyName(collidingB)}
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			for i, tpl := range []string{collidingA, collidingB} {
				np, err := admin.NetworkingV1().NetworkPolicies("sandboxes").Get(context.Background(), names[i], metav1.GetOptions{})
				if assert.NoError(ct, err, "policy of template %d", i) {
					assert.True(ct, policyMatches(np, TemplatePolicy("sandboxes", tpl, rules, true)))
				}
			}
		}, 30*time.Second, 50*time.Millisecond)
		before := []string{policyVersion(t, admin, names[0]), policyVersion(t, admin, names[1])}
		afterReconciles(t, c, adminDyn, collidingA, 3)
		assert.Equal(t, before, []string{policyVersion(t, admin, names[0]), policyVersion(t, admin, names[1])}, "no rewrite after convergence")
		assert.Zero(t, testutil.ToFloat64(c.drift.WithLabelValues("NetworkPolicy", DriftModified)), "no drift from our own writes")
	})

	t.Run("a template whose policy name another template holds is refused, once, and nothing flaps", func(t *testing.T) {
		// A policy of that name already there for template "holder". Without Sandgate's
		// managed-by label: the controller would otherwise delete it, no rule asking for it,
		// before "late" exists.
		held := TemplatePolicy("sandboxes", "holder", rules, true)
		held.Name = TemplatePolicyName("late")
		delete(held.Labels, LabelManagedBy)
		_, err := admin.NetworkingV1().NetworkPolicies("sandboxes").Create(context.Background(), held, metav1.CreateOptions{})
		require.NoError(t, err)
		kubetest.Template(t, adminDyn, "sandboxes", "late", Unmanaged)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			assert.Equal(ct, 1.0, testutil.ToFloat64(c.collided.WithLabelValues("NetworkPolicy")))
			evs, err := admin.CoreV1().Events("sandboxes").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=SandgateNameCollision"})
			if assert.NoError(ct, err) && assert.Len(ct, evs.Items, 1) {
				assert.Equal(ct, "late", evs.Items[0].InvolvedObject.Name)
				assert.Contains(ct, evs.Items[0].Message, "template holder's")
			}
		}, 30*time.Second, 50*time.Millisecond)
		before := policyVersion(t, admin, held.Name)
		afterReconciles(t, c, adminDyn, "late", 3)
		assert.Equal(t, before, policyVersion(t, admin, held.Name), "the holder's policy is left alone")
		np, err := admin.NetworkingV1().NetworkPolicies("sandboxes").Get(context.Background(), held.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "holder", np.Annotations[AnnotationTemplate])
		assert.Equal(t, 1.0, testutil.ToFloat64(c.collided.WithLabelValues("NetworkPolicy")), "reported once")
	})
}
