package kube

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation"
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
}

// Two template names of 237 characters whose FNV-1a 32-bit hashes (the template-ref-hash label)
// are equal, found by a birthday search.
var (
	collidingA = "coding-agent-" + strings.Repeat("x", 217) + "-pujfaa"
	collidingB = "coding-agent-" + strings.Repeat("x", 217) + "-8wfhaa"
)

func TestTemplatePolicyName(t *testing.T) {
	t.Run("the whole template name when it fits", func(t *testing.T) {
		fits := strings.Repeat("a", 253-len("sandgate-template-"))
		assert.Equal(t, "sandgate-template-"+fits, TemplatePolicyName(fits))
		assert.Equal(t, "sandgate-template-coder", TemplatePolicyName("coder"))
	})
	t.Run("two long names with one 32-bit hash get two policies", func(t *testing.T) {
		require.Equal(t, TemplateRefHash(collidingA), TemplateRefHash(collidingB), "the fixture collides")
		a, b := TemplatePolicyName(collidingA), TemplatePolicyName(collidingB)
		assert.NotEqual(t, a, b)
		for _, n := range []string{a, b} {
			assert.Len(t, n, 253)
			assert.Empty(t, validation.IsDNS1123Subdomain(n), n)
		}
	})
	t.Run("a long name cut before a dot or dash still makes a valid name", func(t *testing.T) {
		for _, name := range []string{strings.Repeat("a.", 120) + "end", strings.Repeat("a-", 120) + "end"} {
			assert.Empty(t, validation.IsDNS1123Subdomain(TemplatePolicyName(name)), name)
		}
	})
}

func TestFirstTemplateKeepsAPolicyName(t *testing.T) {
	// TemplatePolicyName does not collide in practice; were two names equal, the first template
	// (RenderNamespace sorts them by name) keeps the policy and the second is reported.
	rules := SandboxRules(testConfig(true))
	a, b, c := TemplatePolicy("sandboxes", "a", rules, true), TemplatePolicy("sandboxes", "b", rules, true), TemplatePolicy("sandboxes", "c", rules, true)
	b.Name = a.Name
	kept, collisions := firstTakesName([]*networkingv1.NetworkPolicy{a, b, c})
	assert.Equal(t, []*networkingv1.NetworkPolicy{a, c}, kept)
	assert.Equal(t, []Collision{{Kind: "NetworkPolicy", Namespace: "sandboxes", Name: a.Name, Template: "b", Holder: "a"}}, collisions)

	d := RenderNamespace(testConfig(true), "sandboxes", []Template{
		{Namespace: "sandboxes", Name: collidingB, Management: Unmanaged},
		{Namespace: "sandboxes", Name: collidingA, Management: Unmanaged},
	})
	assert.Empty(t, d.Collisions, "the long names of one 32-bit hash get two policies")
	assert.Len(t, d.NetworkPolicies, 3)
}
