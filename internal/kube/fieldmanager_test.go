package kube

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/test/kubetest"
)

// TestControllerOwnsOnlyTheTemplatesRules: Sandgate's field manager is its own and owns a
// template's spec.networkPolicy and nothing else, even on a template someone applied whole
// under the field manager "sandgate" (as earlier instructions led to, after which every apply
// of the rules alone failed with "spec.podTemplate: Required value").
func TestControllerOwnsOnlyTheTemplatesRules(t *testing.T) {
	cluster := kubetest.Start(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	ctx := context.Background()
	setupNamespaces(t, admin)
	cfg := testConfig(true)
	cfg.Controller.Resync = 0
	rules := SandboxRules(cfg)

	apply := func(name, manager string) {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
			"metadata": map[string]any{"name": name, "namespace": "sandboxes"},
			"spec":     map[string]any{"podTemplate": kubetest.PodTemplate()},
		}}
		_, err := adminDyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Apply(ctx, name, obj, metav1.ApplyOptions{FieldManager: manager, Force: true})
		require.NoError(t, err)
	}
	apply("whole-under-sandgate", "sandgate")
	apply("whole-under-kubectl", "kubectl")
	startController(t, cluster, cfg)

	for _, name := range []string{"whole-under-sandgate", "whole-under-kubectl"} {
		t.Run(name, func(t *testing.T) {
			var got *unstructured.Unstructured
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				var err error
				got, err = adminDyn.Resource(SandboxTemplateGVR).Namespace("sandboxes").Get(ctx, name, metav1.GetOptions{})
				require.NoError(ct, err)
				tpl, err := TemplateFromUnstructured(got)
				require.NoError(ct, err)
				if assert.NotNil(ct, tpl.NetworkPolicy, "the rules are written") {
					assert.Equal(ct, rules, *tpl.NetworkPolicy)
				}
			}, 30*time.Second, 50*time.Millisecond)
			_, found, _ := unstructured.NestedMap(got.Object, "spec", "podTemplate")
			assert.True(t, found, "spec.podTemplate is left to its owner")
			assert.Equal(t, map[string]any{"f:spec": map[string]any{"f:networkPolicy": true}}, ownedTopFields(t, got, FieldManager),
				"Sandgate's field manager owns spec.networkPolicy and nothing else")
		})
	}
}

// ownedTopFields is the field set manager applied to obj, down to the fields under spec
// (their own subfields as true).
func ownedTopFields(t *testing.T, obj *unstructured.Unstructured, manager string) map[string]any {
	t.Helper()
	for _, mf := range obj.GetManagedFields() {
		if mf.Manager != manager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		require.NoError(t, json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields))
		out := map[string]any{}
		for k, v := range fields {
			sub, ok := v.(map[string]any)
			if !ok || k != "f:spec" {
				out[k] = true
				continue
			}
			s := map[string]any{}
			for sk := range sub {
				s[sk] = true
			}
			out[k] = s
		}
		return out
	}
	return nil
}
