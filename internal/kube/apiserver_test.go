package kube

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/test/kubetest"
)

// setupNamespaces creates the namespaces of testConfig.
func setupNamespaces(t *testing.T, cs kubernetes.Interface) {
	for _, ns := range []string{"sandboxes", "sandgate", "router", "monitoring"} {
		kubetest.Namespace(t, cs, ns, nil)
	}
}

// TestRenderedObjectsAreAcceptedByTheAPIServer server-side applies everything Sandgate renders
// (no dry run): the NetworkPolicies, spec.networkPolicy of a Managed template, the policy the
// Agent Sandbox controller would build from it, and the RBAC objects.
func TestRenderedObjectsAreAcceptedByTheAPIServer(t *testing.T) {
	cluster := kubetest.Start(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	ctx := context.Background()
	setupNamespaces(t, cs)
	kubetest.Template(t, dyn, "sandboxes", "coder", "")
	kubetest.Template(t, dyn, "sandboxes", "cilium-coder", Unmanaged)

	for _, dns := range []bool{true, false} {
		cfg := testConfig(dns)
		templates := readTemplates(t, dyn, "sandboxes")
		require.Len(t, templates, 2)
		d := Render(cfg, templates)
		a := Applier{Client: cs, Dynamic: dyn}
		require.NoError(t, a.Apply(ctx, d))

		for _, np := range d.NetworkPolicies {
			got, err := cs.NetworkingV1().NetworkPolicies(np.Namespace).Get(ctx, np.Name, metav1.GetOptions{})
			require.NoError(t, err)
			assert.True(t, policyMatches(got, np), "%s/%s stored as rendered", np.Namespace, np.Name)
		}
		after := readTemplates(t, dyn, "sandboxes")
		for _, tpl := range after {
			if tpl.Name == "coder" {
				require.NotNil(t, tpl.NetworkPolicy)
				assert.True(t, equality.Semantic.DeepEqual(*tpl.NetworkPolicy, SandboxRules(cfg)), "spec.networkPolicy stored as rendered")
			}
		}
		// The Agent Sandbox controller turns spec.networkPolicy into a NetworkPolicy; its rules
		// must be valid NetworkPolicy rules.
		for _, ta := range d.Templates {
			np := TemplatePolicy(ta.Namespace, ta.Name, ta.Spec, false)
			np.Name = "agent-sandbox-" + ta.Name
			require.NoError(t, a.ApplyNetworkPolicy(ctx, np))
		}

		// Applying the same again changes nothing.
		before := resourceVersions(t, cs, d)
		require.NoError(t, a.Apply(ctx, d))
		assert.Equal(t, before, resourceVersions(t, cs, d), "a second apply is a no-op")
	}

	for _, obj := range RBAC(testConfig(false), RBACSubject{Kind: rbacv1.ServiceAccountKind, Name: "sandgate", Namespace: "sandgate"}) {
		body, err := json.Marshal(obj)
		require.NoError(t, err)
		force := true
		opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force}
		switch o := obj.(type) {
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		}
		require.NoError(t, err, "apply %T", obj)
	}
}

// TestControllerConverges runs the controller authenticated as a user bound only to the Roles
// of RBAC() and checks that it converges as templates are created, changed and deleted, and
// that it repairs and reports drift.
func TestControllerConverges(t *testing.T) {
	cluster := kubetest.Start(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	setupNamespaces(t, admin)
	cfg := testConfig(true)
	cfg.Controller.Resync = 0
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
	kubetest.Template(t, adminDyn, "sandboxes", "coder", Managed)

	client, dyn := kubetest.Clients(t, cluster.Sandgate)
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := NewController(client, dyn, cfg, logger, reg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	policy := func(ns, name string) (*networkingv1.NetworkPolicy, error) {
		return admin.NetworkingV1().NetworkPolicies(ns).Get(ctx, name, metav1.GetOptions{})
	}
	converged := func(t *testing.T, what string, want []*networkingv1.NetworkPolicy, managed map[string]bool, gone ...string) {
		t.Helper()
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			for _, np := range want {
				got, err := policy(np.Namespace, np.Name)
				if assert.NoError(ct, err, np.Name) {
					assert.True(ct, policyMatches(got, np), "%s matches", np.Name)
				}
			}
			for _, name := range gone {
				_, err := policy("sandboxes", name)
				assert.True(ct, apierrors.IsNotFound(err), "%s is gone: %v", name, err)
			}
			for _, tpl := range readTemplates(t, adminDyn, "sandboxes") {
				if managed[tpl.Name] {
					assert.NotNil(ct, tpl.NetworkPolicy, tpl.Name)
					if tpl.NetworkPolicy != nil {
						assert.True(ct, equality.Semantic.DeepEqual(*tpl.NetworkPolicy, SandboxRules(cfg)), "%s spec.networkPolicy", tpl.Name)
					}
				}
			}
		}, 20*time.Second, 50*time.Millisecond, what)
	}
	rules := SandboxRules(cfg)

	t.Run("on start it applies the namespace deny, its own ingress and the Managed template", func(t *testing.T) {
		converged(t, "start", []*networkingv1.NetworkPolicy{NamespaceDeny("sandboxes"), SandgateIngress(cfg)}, map[string]bool{"coder": true})
		assert.True(t, c.HasSynced())
	})
	t.Run("an Unmanaged template created later gets its own NetworkPolicy", func(t *testing.T) {
		kubetest.Template(t, adminDyn, "sandboxes", "cilium-coder", Unmanaged)
		converged(t, "unmanaged created", []*networkingv1.NetworkPolicy{TemplatePolicy("sandboxes", "cilium-coder", rules, true)}, map[string]bool{"coder": true})
	})
	t.Run("switching management modes moves the rules", func(t *testing.T) {
		setManagement(t, adminDyn, "coder", Unmanaged)
		setManagement(t, adminDyn, "cilium-coder", Managed)
		converged(t, "switched", []*networkingv1.NetworkPolicy{TemplatePolicy("sandboxes", "coder", rules, true)},
			map[string]bool{"cilium-coder": true}, TemplatePolicyName("cilium-coder"))
		assert.Zero(t, testutil.ToFloat64(c.drift.WithLabelValues("NetworkPolicy", DriftDeleted))+
			testutil.ToFloat64(c.drift.WithLabelValues("NetworkPolicy", DriftModified))+
			testutil.ToFloat64(c.drift.WithLabelValues("SandboxTemplate", DriftModified)),
			"Sandgate's own writes are never reported as drift")
	})
	t.Run("a changed NetworkPolicy is repaired and reported as drift", func(t *testing.T) {
		patch := []byte(`{"spec":{"egress":[{}]}}`)
		_, err := admin.NetworkingV1().NetworkPolicies("sandboxes").Patch(ctx, TemplatePolicyName("coder"), types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err)
		converged(t, "repaired", []*networkingv1.NetworkPolicy{TemplatePolicy("sandboxes", "coder", rules, true)}, nil)
		assert.GreaterOrEqual(t, testutil.ToFloat64(c.drift.WithLabelValues("NetworkPolicy", DriftModified)), 1.0)
	})
	t.Run("a deleted NetworkPolicy is recreated and reported as drift", func(t *testing.T) {
		require.NoError(t, admin.NetworkingV1().NetworkPolicies("sandboxes").Delete(ctx, NamespaceDenyName, metav1.DeleteOptions{}))
		converged(t, "recreated", []*networkingv1.NetworkPolicy{NamespaceDeny("sandboxes")}, nil)
		assert.GreaterOrEqual(t, testutil.ToFloat64(c.drift.WithLabelValues("NetworkPolicy", DriftDeleted)), 1.0)
	})
	t.Run("a changed spec.networkPolicy of a Managed template is repaired and reported", func(t *testing.T) {
		patch := []byte(`{"spec":{"networkPolicy":{"egress":[{}]}}}`)
		_, err := adminDyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Patch(ctx, "cilium-coder", types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err)
		converged(t, "template repaired", nil, map[string]bool{"cilium-coder": true})
		assert.GreaterOrEqual(t, testutil.ToFloat64(c.drift.WithLabelValues("SandboxTemplate", DriftModified)), 1.0)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			evs, err := admin.CoreV1().Events("sandboxes").List(ctx, metav1.ListOptions{FieldSelector: "reason=SandgateDrift"})
			assert.NoError(ct, err)
			assert.NotEmpty(ct, evs.Items, "drift is recorded as an event")
		}, 10*time.Second, 100*time.Millisecond)
	})
	t.Run("deleting a template removes what Sandgate created for it", func(t *testing.T) {
		require.NoError(t, adminDyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Delete(ctx, "coder", metav1.DeleteOptions{}))
		converged(t, "template deleted", []*networkingv1.NetworkPolicy{NamespaceDeny("sandboxes")}, nil, TemplatePolicyName("coder"))
	})
	t.Run("RBAC is enforced: the controller's user can do nothing beyond its rules", func(t *testing.T) {
		_, err := client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err), "list pods outside its namespaces: %v", err)
		_, err = client.CoreV1().Secrets("sandboxes").List(ctx, metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err), "list secrets: %v", err)
		err = dyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Delete(ctx, "cilium-coder", metav1.DeleteOptions{})
		assert.True(t, apierrors.IsForbidden(err), "delete a template: %v", err)
		_, err = client.NetworkingV1().NetworkPolicies("router").List(ctx, metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err), "NetworkPolicies of an unrelated namespace: %v", err)
		assert.Zero(t, testutil.ToFloat64(c.reconciles.WithLabelValues("error")), "no reconcile failed for lack of permission")
	})
}

func readTemplates(t *testing.T, dyn dynamic.Interface, ns string) []Template {
	t.Helper()
	list, err := dyn.Resource(SandboxTemplateGVR).Namespace(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []Template
	for i := range list.Items {
		tpl, err := TemplateFromUnstructured(&list.Items[i])
		require.NoError(t, err)
		out = append(out, tpl)
	}
	return out
}

func setManagement(t *testing.T, dyn dynamic.Interface, name, mode string) {
	t.Helper()
	patch := []byte(`{"spec":{"networkPolicyManagement":"` + mode + `"}}`)
	_, err := dyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

func resourceVersions(t *testing.T, cs kubernetes.Interface, d Desired) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, np := range d.NetworkPolicies {
		got, err := cs.NetworkingV1().NetworkPolicies(np.Namespace).Get(context.Background(), np.Name, metav1.GetOptions{})
		require.NoError(t, err)
		out[np.Namespace+"/"+np.Name] = got.ResourceVersion
	}
	return out
}
