package deploy

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/test/kubetest"
)

// serviceMonitorCRD is the least of the Prometheus Operator's CRD that lets the apiserver
// store the chart's ServiceMonitor.
const serviceMonitorCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// Every object the chart renders, for every values file, is accepted by a real kube-apiserver
// (server-side apply), the RBAC it grants works as intended there, and the example
// SandboxTemplate and its netpol output apply too. One apiserver serves all subtests.
func TestChartAppliesToRealAPIServer(t *testing.T) {
	helmBin(t)
	cluster := kubetest.Start(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	crd := parseObjects(t, serviceMonitorCRD)[0]
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	_, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
	require.NoError(t, err)
	mapper := newMapper(t, cs)
	require.Eventually(t, func() bool {
		mapper.Reset()
		_, err := mapper.RESTMapping(schema.GroupKind{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"}, "v1")
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "ServiceMonitor CRD not served")

	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			release, ns := "sandgate-"+c.name, "sg-"+c.name
			objs := render(t, c, release, ns)
			for _, o := range objs {
				ensureNamespace(t, ctx, cs, o.GetNamespace())
			}
			for _, o := range objs {
				apply(t, ctx, dyn, mapper, o)
			}
			// Every case's admission policy binds the namespace "sandboxes", each with its own
			// rules: the example template below is checked against the policy of its own release.
			t.Cleanup(func() { deleteAdmissionPolicies(t, ctx, cs, objs) })
			d, err := cs.AppsV1().Deployments(ns).Get(ctx, release, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, int64(1), d.Generation)

			// The ServiceAccount's permissions, asked of the apiserver's RBAC authorizer.
			m := materialize(t, objs)
			if !m.cfg.Kubernetes.Enabled {
				return
			}
			sa := "system:serviceaccount:" + ns + ":" + release
			for _, sandboxNS := range m.cfg.Kubernetes.Namespaces {
				assert.True(t, can(t, ctx, cs, sa, ns, sandboxNS, "", "pods", "watch"), "watch pods in %s", sandboxNS)
				assert.True(t, can(t, ctx, cs, sa, ns, sandboxNS, "agents.x-k8s.io", "sandboxes", "list"))
				assert.False(t, can(t, ctx, cs, sa, ns, sandboxNS, "", "secrets", "get"), "no Secret access")
				assert.False(t, can(t, ctx, cs, sa, ns, sandboxNS, "", "pods", "delete"))
				ctl := m.cfg.Kubernetes.Controller.Enabled
				assert.Equal(t, ctl, can(t, ctx, cs, sa, ns, sandboxNS, "networking.k8s.io", "networkpolicies", "create"))
				assert.Equal(t, ctl, can(t, ctx, cs, sa, ns, sandboxNS, "extensions.agents.x-k8s.io", "sandboxtemplates", "patch"))
			}
			assert.False(t, can(t, ctx, cs, sa, ns, "kube-system", "", "pods", "list"), "nothing outside the sandbox namespaces")
			ingress := access{"patch", "networking.k8s.io", "networkpolicies", "", ns, kube.SandgateIngressName}
			assert.Equal(t, m.cfg.Kubernetes.Controller.Enabled, ingress.allowed(t, ctx, cs, sa, ns),
				"the controller owns sandgate-ingress in its own namespace")
		})
	}

	t.Run("example SandboxTemplate and its netpol output, admitted by the default chart's policy", func(t *testing.T) {
		ensureNamespace(t, ctx, cs, "sandboxes")
		ensureNamespace(t, ctx, cs, "sandgate")
		// The example is for release "sandgate" in namespace "sandgate" (its header says so).
		objs := render(t, chartCase{name: "default"}, "sandgate", "sandgate")
		for _, o := range append(find(objs, "ValidatingAdmissionPolicy"), find(objs, "ValidatingAdmissionPolicyBinding")...) {
			apply(t, ctx, dyn, mapper, o)
		}
		// The cases above deleted their policies, but the apiserver's admission plugin learns of
		// a deletion from its informer, a moment later: until then one of them can still refuse
		// the example (its rules are its release's). Wait until this release's own policy is what
		// refuses a bare template, and none of theirs does.
		own := map[string]bool{}
		for _, o := range find(objs, "ValidatingAdmissionPolicyBinding") {
			own[o.GetName()] = true
		}
		require.Eventually(t, func() bool {
			bare := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
				"metadata": map[string]any{"generateName": "bare-", "namespace": "sandboxes"},
				"spec":     map[string]any{"podTemplate": kubetest.PodTemplate()}}}
			_, err := dyn.Resource(kubetest.SandboxTemplateGVR).Namespace("sandboxes").Create(ctx, bare, metav1.CreateOptions{})
			return apierrors.IsForbidden(err) && !refusedByOther(err, own)
		}, 30*time.Second, 100*time.Millisecond, "this release's admission policy is not the one enforced")
		// The template is the user's; the rules are Sandgate's, applied under its own field
		// manager (as the netpol file's header says). Under one manager the second apply would
		// drop spec.podTemplate, which the CRD requires.
		// In this order: the template first (a slice, not a map, whose order Go randomises).
		for _, step := range []struct{ file, manager string }{
			{"sandbox-template.yaml", "kubectl"}, {"sandbox-template.netpol.yaml", kube.FieldManager},
		} {
			for _, o := range parseObjects(t, readFile(t, filepath.Join(repoRoot, "examples", step.file))) {
				// A policy of the cases above may still be enforced when another was seen gone.
				var err error
				require.Eventually(t, func() bool {
					err = tryApply(ctx, dyn, mapper, o, step.manager)
					return !refusedByOther(err, own)
				}, 30*time.Second, 100*time.Millisecond, "a deleted admission policy is still enforced")
				require.NoError(t, err, "apply %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
			}
		}
		got, err := dyn.Resource(kubetest.SandboxTemplateGVR).Namespace("sandboxes").Get(ctx, "coding-agent", metav1.GetOptions{})
		require.NoError(t, err)
		egress, _, _ := unstructured.NestedSlice(got.Object, "spec", "networkPolicy", "egress")
		assert.Len(t, egress, 2, "egress to Sandgate and to the cluster DNS")
		mgmt, _, _ := unstructured.NestedString(got.Object, "spec", "networkPolicyManagement")
		assert.Equal(t, "Managed", mgmt)
	})
}

// deleteAdmissionPolicies deletes the ValidatingAdmissionPolicies and bindings of objs.
func deleteAdmissionPolicies(t *testing.T, ctx context.Context, cs kubernetes.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	adm := cs.AdmissionregistrationV1()
	for _, o := range find(objs, "ValidatingAdmissionPolicyBinding") {
		require.NoError(t, adm.ValidatingAdmissionPolicyBindings().Delete(ctx, o.GetName(), metav1.DeleteOptions{}))
	}
	for _, o := range find(objs, "ValidatingAdmissionPolicy") {
		require.NoError(t, adm.ValidatingAdmissionPolicies().Delete(ctx, o.GetName(), metav1.DeleteOptions{}))
	}
}

func newMapper(t *testing.T, cs kubernetes.Interface) meta.ResettableRESTMapper {
	t.Helper()
	dc, ok := cs.Discovery().(discovery.DiscoveryInterface)
	require.True(t, ok)
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

func ensureNamespace(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) {
	t.Helper()
	if name == "" {
		return
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// apply server-side applies o as Helm's own field manager would own it.
func apply(t *testing.T, ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) {
	t.Helper()
	applyAs(t, ctx, dyn, mapper, o, "helm")
}

// applyAs server-side applies o under field manager.
func applyAs(t *testing.T, ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured, manager string) {
	t.Helper()
	require.NoError(t, tryApply(ctx, dyn, mapper, o, manager), "apply %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// tryApply server-side applies o under field manager and returns the error.
func tryApply(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured, manager string) error {
	gvk := o.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s is not served: %w", gvk, err)
	}
	var res dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		res = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
	}
	_, err = res.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: manager, Force: true})
	return err
}

// refusedByOther reports err as a refusal by a ValidatingAdmissionPolicy binding not in own.
func refusedByOther(err error, own map[string]bool) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	m := refusingBinding.FindStringSubmatch(err.Error())
	return m != nil && !own[m[1]]
}

var refusingBinding = regexp.MustCompile(`with binding '([^']+)' denied request`)

// can asks the apiserver whether the ServiceAccount user may do verb on resource in ns.
func can(t *testing.T, ctx context.Context, cs kubernetes.Interface, user, saNS, ns, group, resource, verb string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Group: group, Resource: resource, Verb: verb,
		},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	require.NoError(t, err)
	if strings.Contains(got.Status.EvaluationError, "error") {
		t.Logf("SubjectAccessReview %s %s/%s: %s", verb, ns, resource, got.Status.EvaluationError)
	}
	return got.Status.Allowed
}
