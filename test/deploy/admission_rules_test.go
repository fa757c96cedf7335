package deploy

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/internal/kube"
)

// rulesValues are values that change Sandgate's rules in every way the config allows, beside
// the chart's own values files: through the chart's values and through config overrides the
// chart merges over them.
var rulesValues = map[string]string{
	"no-dns":  "kubernetes: {dns: false}\n",
	"ports":   "ports: {mcp: 18080, proxy: 13128, admin: 19090}\n",
	"ingress": "kubernetes:\n  ingressFrom:\n    - {name: router, namespace_selector: {kubernetes.io/metadata.name: agent-sandbox-system, tier: edge}, pod_selector: {app: sandbox-router}, ports: [8888, 9000]}\n    - {name: same-namespace, pod_selector: {role: debugger, team: infra}}\n    - {name: any-pod, namespace_selector: {team: ops}}\n",
	"config-overrides": "config:\n  kubernetes:\n    sandgate: {pod_selector: {extra: x}, ports: {mcp: 7000}}\n" +
		"    dns: {namespace_selector: {dns: here}, pod_selector: {k8s-app: coredns, z: last}}\n" +
		"    ingress_from: [{name: dispatcher, pod_selector: {app: dispatcher}, ports: [1234]}]\n",
}

// The rules the chart writes into its admission policy are kube.CanonicalRules of the rules
// Sandgate derives from the config the chart renders, for the default values, every values
// file and values that change each part of the rules: the policy admits exactly the templates
// Sandgate's controller writes. (TestAdmissionPolicyOnRealAPIServer checks on a real apiserver
// that the policy's CEL reads a template in the same canonical form.)
func TestAdmissionPolicyCarriesTheReleasesRules(t *testing.T) {
	cases := chartCases(t)
	for name, values := range rulesValues {
		f := filepath.Join(t.TempDir(), name+"-values.yaml")
		require.NoError(t, os.WriteFile(f, []byte(values), 0o600))
		cases = append(cases, chartCase{name: name, values: f})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			objs := render(t, c, "sandgate", "sandgate")
			k := materialize(t, objs).cfg.Kubernetes
			var policy *unstructured.Unstructured
			for _, o := range find(objs, "ValidatingAdmissionPolicy") {
				if strings.HasSuffix(o.GetName(), "-template-rules") {
					policy = o
				}
			}
			if !k.Enabled {
				assert.Nil(t, policy, "no admission policy without kubernetes.enabled")
				return
			}
			require.NotNil(t, policy)
			_, hasParam, _ := unstructured.NestedFieldNoCopy(policy.Object, "spec", "paramKind")
			assert.False(t, hasParam, "the rules are the policy's own, not a parameter the apiserver may stop watching")
			vars, _, _ := unstructured.NestedSlice(policy.Object, "spec", "variables")
			var literal string
			for _, v := range vars {
				if v.(map[string]any)["name"] == "sandgate" {
					literal, _ = v.(map[string]any)["expression"].(string)
				}
			}
			got, err := strconv.Unquote(literal)
			require.NoError(t, err, "variables.sandgate is a CEL string literal: %s", literal)
			assert.Equal(t, kube.CanonicalRules(kube.SandboxRules(k)), got)
		})
	}
}
