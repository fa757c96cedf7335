package kube

import (
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
	t.Run("identity alone only reads pods and sandboxes", func(t *testing.T) {
		rules := SandboxNamespaceRules(false)
		assert.Len(t, rules, 2)
		assert.Equal(t, []string{"get", "list", "watch"}, verbs(rules, "pods"))
		assert.Equal(t, []string{"get", "list", "watch"}, verbs(rules, "sandboxes"))
	})
	t.Run("the controller may patch templates but never create or delete them", func(t *testing.T) {
		assert.Equal(t, []string{"get", "list", "watch", "patch"}, verbs(SandboxNamespaceRules(true), "sandboxtemplates"))
	})
	t.Run("nothing reads secrets, claims or anything cluster-wide", func(t *testing.T) {
		for _, r := range append(SandboxNamespaceRules(true), SandgateNamespaceRules()...) {
			assert.NotContains(t, r.Resources, "secrets")
			assert.NotContains(t, r.Resources, "sandboxclaims")
			assert.NotContains(t, r.Verbs, "*")
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
