package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/test/kubetest"
)

// The chart's ValidatingAdmissionPolicy on a real kube-apiserver with the upstream CRDs: a
// Managed SandboxTemplate in a sandbox namespace is admitted only with `sandgate netpol`'s rules
// (the CEL's canonical form of the template, the chart's of the release's rules and
// kube.CanonicalRules agree), from the moment the policy is loaded, and refused with a message
// that says what to do.
func TestAdmissionPolicyOnRealAPIServer(t *testing.T) {
	helmBin(t)
	cluster := kubetest.Start(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mapper := newMapper(t, cs)

	// Rules with every part of the canonical form: two egress rules (DNS on), ingress peers
	// with and without ports, a peer in the policy's own namespace.
	values := filepath.Join(t.TempDir(), "values.yaml")
	require.NoError(t, os.WriteFile(values, []byte(`
kubernetes:
  dns: true
  ingressFrom:
    - {name: router, namespace_selector: {kubernetes.io/metadata.name: agent-sandbox-system}, pod_selector: {app: sandbox-router}, ports: [8888]}
    - {name: same-namespace, pod_selector: {role: debugger, team: infra}}
`), 0o600))
	objs := render(t, chartCase{name: "admission", values: values}, "sandgate", "sandgate")
	rulesPolicies := 0
	for _, o := range find(objs, "ValidatingAdmissionPolicy") {
		if strings.HasSuffix(o.GetName(), "-template-rules") {
			rulesPolicies++
		}
	}
	require.Equal(t, 1, rulesPolicies, "on by default")
	for _, o := range objs {
		ensureNamespace(t, ctx, cs, o.GetNamespace())
	}
	ensureNamespace(t, ctx, cs, "sandboxes")
	ensureNamespace(t, ctx, cs, "elsewhere")
	for _, o := range objs {
		apply(t, ctx, dyn, mapper, o)
	}
	m := materialize(t, objs)
	netpol := func(name string) map[string]any {
		out := run(t, sandgateBin(t), "netpol", "--config", m.config, "--template", "sandboxes/"+name, "--management", kube.Managed)
		gen := parseObjects(t, out)
		require.Len(t, gen, 1)
		np, _, _ := unstructured.NestedMap(gen[0].Object, "spec", "networkPolicy")
		require.NotEmpty(t, np)
		return np
	}
	template := func(ns, name, management string, np map[string]any) error {
		spec := map[string]any{"podTemplate": kubetest.PodTemplate()}
		if management != "" {
			spec["networkPolicyManagement"] = management
		}
		if np != nil {
			spec["networkPolicy"] = np
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
		_, err := dyn.Resource(kubetest.SandboxTemplateGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
		return err
	}
	// The policy is enforced once the apiserver has loaded it: until then creates succeed.
	probes := 0
	probe := func() string { probes++; return fmt.Sprintf("probe-%d", probes) }
	require.Eventually(t, func() bool {
		return apierrors.IsForbidden(template("sandboxes", probe(), "", nil))
	}, 30*time.Second, 100*time.Millisecond, "the policy is not enforced")
	require.NoError(t, template("sandboxes", "coder", "", netpol("coder")), "nothing for Sandgate to write first")

	t.Run("a template with `sandgate netpol --template` output is admitted", func(t *testing.T) {
		require.NoError(t, template("sandboxes", "coder-2", kube.Managed, netpol("coder-2")))
	})
	t.Run("a template without rules is refused with what to do", func(t *testing.T) {
		err := template("sandboxes", "bare", "", nil)
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		assert.Contains(t, err.Error(), "sandgate netpol --template sandboxes/bare --management Managed")
		assert.Contains(t, err.Error(), "networkPolicyManagement: Unmanaged")
	})
	t.Run("a template whose rules differ in any part is refused", func(t *testing.T) {
		for name, edit := range map[string]func(np map[string]any){
			"extra-egress": func(np map[string]any) {
				np["egress"] = append(np["egress"].([]any), map[string]any{"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "0.0.0.0/0"}}}})
			},
			"other-port": func(np map[string]any) {
				rule := np["egress"].([]any)[0].(map[string]any)
				rule["ports"].([]any)[0].(map[string]any)["port"] = int64(8443)
			},
			"wider-peer": func(np map[string]any) {
				rule := np["egress"].([]any)[0].(map[string]any)
				delete(rule["to"].([]any)[0].(map[string]any), "podSelector")
			},
			"no-ingress-ports": func(np map[string]any) {
				delete(np["ingress"].([]any)[0].(map[string]any), "ports")
			},
			"other-label": func(np map[string]any) {
				peer := np["ingress"].([]any)[1].(map[string]any)["from"].([]any)[0].(map[string]any)
				peer["podSelector"].(map[string]any)["matchLabels"].(map[string]any)["team"] = "any"
			},
		} {
			np := netpol(name)
			edit(np)
			err := template("sandboxes", name, "", np)
			assert.True(t, apierrors.IsForbidden(err), "%s: %v", name, err)
		}
	})
	t.Run("an Unmanaged template needs no rules: Sandgate owns its NetworkPolicy", func(t *testing.T) {
		require.NoError(t, template("sandboxes", "cilium", kube.Unmanaged, nil))
	})
	t.Run("templates outside the sandbox namespaces are not Sandgate's", func(t *testing.T) {
		require.NoError(t, template("elsewhere", "bare", "", nil))
	})
	t.Run("an update that drops the rules is refused", func(t *testing.T) {
		u, err := dyn.Resource(kubetest.SandboxTemplateGVR).Namespace("sandboxes").Get(ctx, "coder", metav1.GetOptions{})
		require.NoError(t, err)
		unstructured.RemoveNestedField(u.Object, "spec", "networkPolicy")
		_, err = dyn.Resource(kubetest.SandboxTemplateGVR).Namespace("sandboxes").Update(ctx, u, metav1.UpdateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
	})
}
