package kube

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	rbacv1 "k8s.io/api/rbac/v1"
)

func TestRBAC(t *testing.T) {
	verbs := func(rules []rbacv1.PolicyRule, resource string) []string {
		for _, r := range rules {
			for _, res := range r.Resources {
				if res == resource {
					return r.Verbs
				}
			}
		}
		return nil
	}
	t.Run("identity alone only lists and watches pods, sandboxes, claims and warm pools", func(t *testing.T) {
		rules := SandboxNamespaceRules(false)
		assert.Len(t, rules, 3)
		for _, res := range []string{"pods", "sandboxes", "sandboxclaims", "sandboxwarmpools"} {
			assert.Equal(t, []string{"list", "watch"}, verbs(rules, res), res)
		}
	})
	t.Run("the controller may patch templates but never create or delete them", func(t *testing.T) {
		assert.Equal(t, []string{"get", "list", "watch", "patch"}, verbs(SandboxNamespaceRules(true), "sandboxtemplates"))
	})
	t.Run("nothing reads secrets, writes claims or touches anything cluster-wide", func(t *testing.T) {
		for _, r := range append(SandboxNamespaceRules(true), SandgateNamespaceRules()...) {
			assert.NotContains(t, r.Resources, "secrets")
			if slices.Contains(r.Resources, "sandboxclaims") {
				assert.Equal(t, []string{"list", "watch"}, r.Verbs)
			}
			assert.NotContains(t, r.Verbs, "*")
		}
	})
	t.Run("Sandgate writes no ConfigMap: not its config, not its policies", func(t *testing.T) {
		for _, r := range append(SandboxNamespaceRules(true), SandgateNamespaceRules()...) {
			assert.NotContains(t, r.Resources, "configmaps")
		}
	})
	t.Run("in its own namespace Sandgate reads and writes no NetworkPolicy but sandgate-ingress", func(t *testing.T) {
		for _, r := range SandgateNamespaceRules() {
			if slices.Contains(r.Resources, "networkpolicies") && len(r.ResourceNames) == 0 {
				assert.Equal(t, []string{"list", "watch", "create"}, r.Verbs, "create cannot be limited by name")
			} else if len(r.ResourceNames) > 0 && slices.Contains(r.Resources, "networkpolicies") {
				assert.Equal(t, []string{SandgateIngressName}, r.ResourceNames)
			}
		}
	})
	t.Run("Roles go to each sandbox namespace and to Sandgate's own when the controller runs", func(t *testing.T) {
		cfg := testConfig(false)
		objs := RBAC(cfg, RBACSubject{Kind: rbacv1.ServiceAccountKind, Name: "sg", Namespace: "sandgate"})
		var where []string
		for _, o := range objs {
			if r, ok := o.(*rbacv1.Role); ok {
				where = append(where, r.Namespace)
			}
		}
		assert.Equal(t, []string{"sandboxes", "sandgate"}, where)
		cfg.Controller.Enabled = false
		assert.Len(t, RBAC(cfg, RBACSubject{Kind: rbacv1.UserKind, Name: "sg"}), 2, "identity only: one Role and binding")
	})
}
