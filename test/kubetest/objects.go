package kubetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/internal/identity"
)

// Agent Sandbox resources (the v1beta1 storage versions of the upstream CRDs).
var (
	SandboxGVR         = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	SandboxTemplateGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	SandboxClaimGVR    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	SandboxWarmPoolGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// Namespace creates a namespace (the apiserver adds kubernetes.io/metadata.name).
func Namespace(t testing.TB, cs kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
}

// PodTemplate is the smallest valid spec.podTemplate of a Sandbox or SandboxTemplate: one
// container (the CRDs require spec.containers).
func PodTemplate() map[string]any {
	return map[string]any{"spec": map[string]any{"containers": []any{
		map[string]any{"name": "agent", "image": "example.invalid/agent:1"},
	}}}
}

// WarmPool creates a SandboxWarmPool of replicas sandboxes from template. A v1beta1
// SandboxClaim names a warm pool, never a template.
func WarmPool(t testing.TB, dyn dynamic.Interface, ns, name, template string, replicas int) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"replicas": int64(replicas), "sandboxTemplateRef": map[string]any{"name": template}},
	}}
	return create(t, dyn, SandboxWarmPoolGVR, obj)
}

// Claim creates a SandboxClaim served from warmPool (spec.warmPoolRef, required in v1beta1).
func Claim(t testing.TB, dyn dynamic.Interface, ns, name, warmPool string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": warmPool}},
	}}
	return create(t, dyn, SandboxClaimGVR, obj)
}

// Sandbox creates a Sandbox as the Agent Sandbox claim controller leaves it, for tests without
// the controller: with a template, the sandbox-template-ref annotation and template-ref-hash
// label; with a claim, controlled by it and named in the claim's status.sandbox.name. A template
// without a claim is what a user can write directly (the forged case): the controller would not
// propagate the hash label to the pod, and SandboxPod does not either.
func Sandbox(t testing.TB, dyn dynamic.Interface, ns, name, template string, claim *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"podTemplate": PodTemplate()},
	}}
	if template != "" {
		obj.SetAnnotations(map[string]string{identity.AnnotationTemplateRef: template})
		obj.SetLabels(map[string]string{identity.LabelTemplateRefHash: identity.NameHash(template)})
	}
	if claim != nil {
		obj.SetOwnerReferences([]metav1.OwnerReference{controllerRef(claim)})
	}
	sb := create(t, dyn, SandboxGVR, obj)
	if claim != nil {
		BindClaim(t, dyn, claim, name)
	}
	return sb
}

// BindClaim writes status.sandbox.name of claim, as the claim controller does once it has
// created or adopted the sandbox.
func BindClaim(t testing.TB, dyn dynamic.Interface, claim *unstructured.Unstructured, sandbox string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"sandbox": map[string]any{"name": sandbox}}})
	if _, err := dyn.Resource(SandboxClaimGVR).Namespace(claim.GetNamespace()).Patch(context.Background(), claim.GetName(),
		types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("kubetest: bind claim %s/%s to %s: %v", claim.GetNamespace(), claim.GetName(), sandbox, err)
	}
}

// Template creates a SandboxTemplate with the given networkPolicyManagement ("" keeps the
// CRD default, Managed).
func Template(t testing.TB, dyn dynamic.Interface, ns, name, management string) *unstructured.Unstructured {
	t.Helper()
	spec := map[string]any{"podTemplate": PodTemplate()}
	if management != "" {
		spec["networkPolicyManagement"] = management
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
	return create(t, dyn, SandboxTemplateGVR, obj)
}

// SandboxPod creates a pod controlled by sandbox with the labels the Agent Sandbox controller
// sets: sandbox-name-hash, and the sandbox's template-ref-hash label when the sandbox is
// controlled by an extensions object (a SandboxClaim or SandboxWarmPool), as upstream
// propagates it only then.
func SandboxPod(t testing.TB, cs kubernetes.Interface, sandbox *unstructured.Unstructured, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	l := map[string]string{identity.LabelSandboxNameHash: identity.NameHash(sandbox.GetName())}
	if h := sandbox.GetLabels()[identity.LabelTemplateRefHash]; h != "" && extensionOwned(sandbox) {
		l[identity.LabelTemplateRefHash] = h
	}
	for k, v := range labels {
		l[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sandbox.GetNamespace(), Labels: l,
			OwnerReferences: []metav1.OwnerReference{controllerRef(sandbox)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "example.invalid/agent:1"}}},
	}
	p, err := cs.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: create pod %s: %v", name, err)
	}
	return p
}

func extensionOwned(obj *unstructured.Unstructured) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller {
			gv, err := schema.ParseGroupVersion(ref.APIVersion)
			return err == nil && gv.Group == identity.SandboxClaimGroup
		}
	}
	return false
}

// SetSandboxPodIPs sets a Sandbox's status.podIPs through the status subresource, as the Agent
// Sandbox controller does from the one pod it owns: for tests without the controller.
func SetSandboxPodIPs(t testing.TB, dyn dynamic.Interface, ns, name string, ips ...string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"podIPs": ips}})
	if _, err := dyn.Resource(SandboxGVR).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("kubetest: set status.podIPs of Sandbox %s/%s: %v", ns, name, err)
	}
}

// TenantRules are what a tenant of a sandbox namespace (a dispatcher, a CI job, a team's
// tooling) typically holds there: every verb on pods, Sandboxes and SandboxClaims, read on
// warm pools and templates. Its status subresources are the controller's and the kubelet's.
func TenantRules() []rbacv1.PolicyRule {
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: all},
		{APIGroups: []string{SandboxGVR.Group}, Resources: []string{"sandboxes"}, Verbs: all},
		{APIGroups: []string{SandboxClaimGVR.Group}, Resources: []string{"sandboxclaims"}, Verbs: all},
		{APIGroups: []string{SandboxClaimGVR.Group}, Resources: []string{"sandboxwarmpools", "sandboxtemplates"}, Verbs: []string{"get", "list", "watch"}},
	}
}

// SetPodIPs sets status.podIP and status.podIPs through the status subresource, as a kubelet
// would once the sandbox has its network.
func SetPodIPs(t testing.TB, cs kubernetes.Interface, ns, name string, ips ...string) {
	t.Helper()
	podIPs := make([]map[string]string, 0, len(ips))
	for _, ip := range ips {
		podIPs = append(podIPs, map[string]string{"ip": ip})
	}
	first := ""
	if len(ips) > 0 {
		first = ips[0]
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": first, "podIPs": podIPs}})
	if _, err := cs.CoreV1().Pods(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("kubetest: set IPs of pod %s/%s: %v", ns, name, err)
	}
}

func create(t testing.TB, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	out, err := dyn.Resource(gvr).Namespace(obj.GetNamespace()).Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: create %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return out
}

func controllerRef(owner *unstructured.Unstructured) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: owner.GetAPIVersion(), Kind: owner.GetKind(), Name: owner.GetName(), UID: owner.GetUID(), Controller: &yes}
}

// BindRules creates a Role with rules in ns and binds it to user: the only permissions the
// user then has there (the apiserver enforces RBAC).
func BindRules(t testing.TB, cs kubernetes.Interface, ns, user string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	name := strings.NewReplacer(":", "-", "_", "-").Replace(user) + "-test" // one Role per user
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: rules}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create Role in %s: %v", ns, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create RoleBinding in %s: %v", ns, err)
	}
}
