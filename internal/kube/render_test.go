package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

func TestTemplateRefHash(t *testing.T) {
	cases := []struct{ name, template, want string }{
		{"empty name is the FNV-1a offset basis", "", "811c9dc5"},
		{"one letter", "a", "e40c292c"},
		{"leading zero digits are kept", "python-runtime-template", "0572d487"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := TemplateRefHash(tc.template)
			assert.Equal(t, tc.want, got)
			assert.Len(t, got, 8)
		})
	}
}

func TestRender(t *testing.T) {
	templates := []Template{
		{Namespace: "sandboxes", Name: "zeta", Management: Unmanaged},
		{Namespace: "sandboxes", Name: "alpha", Management: Managed},
		{Namespace: "elsewhere", Name: "ignored", Management: Unmanaged},
	}
	d := Render(testConfig(true), templates)

	t.Run("a Managed template gets spec.networkPolicy, an Unmanaged one a NetworkPolicy", func(t *testing.T) {
		require.Len(t, d.Templates, 1)
		assert.Equal(t, "alpha", d.Templates[0].Name)
		names := []string{}
		for _, np := range d.NetworkPolicies {
			names = append(names, np.Namespace+"/"+np.Name)
		}
		assert.Equal(t, []string{"sandboxes/" + NamespaceDenyName, "sandboxes/sandgate-template-zeta", "sandgate/" + SandgateIngressName}, names)
	})
	t.Run("the Unmanaged template's policy selects its pods by template hash and isolates both ways", func(t *testing.T) {
		np := d.NetworkPolicies[1]
		assert.Equal(t, map[string]string{LabelTemplateRefHash: TemplateRefHash("zeta")}, np.Spec.PodSelector.MatchLabels)
		assert.Len(t, np.Spec.PolicyTypes, 2)
		assert.Equal(t, ManagedByValue, np.Labels[LabelManagedBy])
		assert.Equal(t, "zeta", np.Annotations[AnnotationTemplate])
	})
	t.Run("DNS egress is rendered only when allowed", func(t *testing.T) {
		assert.Len(t, SandboxRules(testConfig(true)).Egress, 2)
		assert.Len(t, SandboxRules(testConfig(false)).Egress, 1)
	})
	t.Run("no ingress peers renders an explicit empty ingress list", func(t *testing.T) {
		cfg := testConfig(false)
		cfg.IngressFrom = nil
		b, err := yaml.Marshal(SandboxRules(cfg))
		require.NoError(t, err)
		assert.Contains(t, string(b), "ingress: []")
	})
	t.Run("equal inputs render identical output whatever the template order", func(t *testing.T) {
		again := Render(testConfig(true), []Template{templates[2], templates[0], templates[1]})
		a, err := yaml.Marshal(d)
		require.NoError(t, err)
		b, err := yaml.Marshal(again)
		require.NoError(t, err)
		assert.Equal(t, string(a), string(b))
	})
	t.Run("a template name too long for the prefix is hashed", func(t *testing.T) {
		long := string(make([]byte, 250))
		assert.Equal(t, "sandgate-template-"+TemplateRefHash(long), TemplatePolicyName(long))
	})
}
