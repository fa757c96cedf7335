package kube

import (
	"context"
	"encoding/json"
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// Applier writes rendered objects with server-side apply under FieldManager, forcing
// ownership of the fields it writes (Sandgate is their only rightful owner).
type Applier struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
}

// Apply writes every object of d.
func (a Applier) Apply(ctx context.Context, d Desired) error {
	for _, np := range d.NetworkPolicies {
		if err := a.ApplyNetworkPolicy(ctx, np); err != nil {
			return err
		}
	}
	for _, t := range d.Templates {
		if err := a.ApplyTemplate(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// ApplyNetworkPolicy server-side applies np.
func (a Applier) ApplyNetworkPolicy(ctx context.Context, np *networkingv1.NetworkPolicy) error {
	body, err := applyBody(np)
	if err != nil {
		return err
	}
	force := true
	_, err = a.Client.NetworkingV1().NetworkPolicies(np.Namespace).Patch(ctx, np.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	if err != nil {
		return fmt.Errorf("apply NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	return nil
}

// ApplyTemplate server-side applies spec.networkPolicy of a Managed SandboxTemplate. It never
// creates a template: applying to one that is gone is reported as not found.
func (a Applier) ApplyTemplate(ctx context.Context, t TemplateApply) error {
	obj, err := t.Object()
	if err != nil {
		return err
	}
	res := a.Dynamic.Resource(SandboxTemplateGVR).Namespace(t.Namespace)
	if _, err := res.Get(ctx, t.Name, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("apply SandboxTemplate %s/%s: %w", t.Namespace, t.Name, err)
	}
	if _, err := res.Apply(ctx, t.Name, obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("apply SandboxTemplate %s/%s spec.networkPolicy: %w", t.Namespace, t.Name, err)
	}
	return nil
}

// DeleteNetworkPolicy removes a policy Sandgate owns; one already gone is not an error.
func (a Applier) DeleteNetworkPolicy(ctx context.Context, ns, name string) error {
	err := a.Client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NetworkPolicy %s/%s: %w", ns, name, err)
	}
	return nil
}

// applyBody is the apply configuration of np: TypeMeta, name, namespace, labels, annotations
// and spec — no status, no creationTimestamp.
func applyBody(np *networkingv1.NetworkPolicy) ([]byte, error) {
	meta := map[string]any{"name": np.Name, "namespace": np.Namespace}
	if len(np.Labels) > 0 {
		meta["labels"] = np.Labels
	}
	if len(np.Annotations) > 0 {
		meta["annotations"] = np.Annotations
	}
	b, err := json.Marshal(map[string]any{
		"apiVersion": "networking.k8s.io/v1",
		"kind":       "NetworkPolicy",
		"metadata":   meta,
		"spec":       np.Spec,
	})
	if err != nil {
		return nil, fmt.Errorf("encode NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	return b, nil
}
