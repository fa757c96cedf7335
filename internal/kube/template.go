package kube

import (
	"encoding/json"
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Values of a SandboxTemplate's spec.networkPolicyManagement.
const (
	// Managed (the default): the Agent Sandbox controller creates one NetworkPolicy per template
	// from spec.networkPolicy; Sandgate writes that field.
	Managed = "Managed"
	// Unmanaged: the Agent Sandbox controller creates no NetworkPolicy; Sandgate creates its own.
	Unmanaged = "Unmanaged"
)

// Template is what Sandgate reads of a SandboxTemplate.
type Template struct {
	Namespace  string
	Name       string
	Management string // Managed or Unmanaged
	// NetworkPolicy is the template's current spec.networkPolicy, nil when absent.
	NetworkPolicy *TemplateNetworkPolicySpec
}

// TemplateNetworkPolicySpec is a SandboxTemplate's spec.networkPolicy: the rules of the shared
// NetworkPolicy the Agent Sandbox controller creates for a Managed template (podSelector and
// policyTypes are the controller's). Both lists are always written, empty meaning deny.
type TemplateNetworkPolicySpec struct {
	Ingress []networkingv1.NetworkPolicyIngressRule `json:"ingress"`
	Egress  []networkingv1.NetworkPolicyEgressRule  `json:"egress"`
}

// TemplateFromUnstructured reads a SandboxTemplate. An empty networkPolicyManagement is
// Managed, the CRD's default.
func TemplateFromUnstructured(u *unstructured.Unstructured) (Template, error) {
	t := Template{Namespace: u.GetNamespace(), Name: u.GetName(), Management: Managed}
	m, _, err := unstructured.NestedString(u.Object, "spec", "networkPolicyManagement")
	if err != nil {
		return t, fmt.Errorf("SandboxTemplate %s/%s: spec.networkPolicyManagement: %w", t.Namespace, t.Name, err)
	}
	switch m {
	case "", Managed:
	case Unmanaged:
		t.Management = Unmanaged
	default:
		return t, fmt.Errorf("SandboxTemplate %s/%s: spec.networkPolicyManagement %q is neither Managed nor Unmanaged", t.Namespace, t.Name, m)
	}
	np, found, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "networkPolicy")
	if err != nil || !found || np == nil {
		return t, nil
	}
	b, err := json.Marshal(np)
	if err != nil {
		return t, fmt.Errorf("SandboxTemplate %s/%s: spec.networkPolicy: %w", t.Namespace, t.Name, err)
	}
	spec := &TemplateNetworkPolicySpec{}
	if err := json.Unmarshal(b, spec); err != nil {
		return t, fmt.Errorf("SandboxTemplate %s/%s: spec.networkPolicy: %w", t.Namespace, t.Name, err)
	}
	t.NetworkPolicy = spec
	return t, nil
}

// TemplateApply is the server-side apply configuration Sandgate writes to a Managed template:
// only spec.networkPolicy, so every other field stays with its owner.
type TemplateApply struct {
	Namespace string
	Name      string
	Spec      TemplateNetworkPolicySpec
}

// Object returns the apply configuration as an object for the dynamic client or for printing.
func (a TemplateApply) Object() (*unstructured.Unstructured, error) {
	b, err := json.Marshal(map[string]any{
		"apiVersion": SandboxTemplateGVR.GroupVersion().String(),
		"kind":       KindSandboxTemplate,
		"metadata":   map[string]any{"name": a.Name, "namespace": a.Namespace},
		"spec":       map[string]any{"networkPolicy": a.Spec},
	})
	if err != nil {
		return nil, fmt.Errorf("encode SandboxTemplate %s/%s: %w", a.Namespace, a.Name, err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		return nil, fmt.Errorf("encode SandboxTemplate %s/%s: %w", a.Namespace, a.Name, err)
	}
	return u, nil
}
