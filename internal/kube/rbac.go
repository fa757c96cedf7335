package kube

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/config"
)

// The RBAC rules below are the only permissions Sandgate needs, in one place: `sandgate netpol
// --rbac` prints them and the Helm chart renders the same Roles. Everything is namespaced; no
// ClusterRole is needed.

// SandboxNamespaceRules are Sandgate's permissions in each namespace that holds sandboxes:
// watching pods, Sandboxes, SandboxClaims and SandboxWarmPools (identity: informers only list
// and watch, so no get), reading and applying SandboxTemplates
// (spec.networkPolicy of Managed templates), owning NetworkPolicies (Unmanaged templates and
// the deny-all), and recording drift events. controller: false drops what only the controller
// needs.
func SandboxNamespaceRules(controller bool) []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{SandboxGVR.Group}, Resources: []string{SandboxGVR.Resource}, Verbs: []string{"list", "watch"}},
		// The claim binding (status.sandbox.name) and the warm pool's template reference are the
		// facts a sandbox's template and claim are verified against.
		{APIGroups: []string{SandboxClaimGVR.Group}, Resources: []string{SandboxClaimGVR.Resource, SandboxWarmPoolGVR.Resource}, Verbs: []string{"list", "watch"}},
	}
	if controller {
		rules = append(rules,
			// patch is server-side apply of spec.networkPolicy; templates are never created or deleted.
			rbacv1.PolicyRule{APIGroups: []string{SandboxTemplateGVR.Group}, Resources: []string{SandboxTemplateGVR.Resource}, Verbs: []string{"get", "list", "watch", "patch"}},
			networkPolicyRule(),
			eventRule(),
		)
	}
	return rules
}

// SandgateNamespaceRules are the controller's permissions in Sandgate's own namespace: the
// sandgate-ingress NetworkPolicy, by name, and recording events. Sandgate can write no ConfigMap
// there: not its policies, not its config.
func SandgateNamespaceRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// The informer lists and watches. Kubernetes cannot limit create to a name (a create's
		// authorization has none), so creating sandgate-ingress needs create; once it exists,
		// Sandgate reads and writes it by name only.
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch", "create"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, ResourceNames: []string{SandgateIngressName}, Verbs: []string{"get", "patch"}},
		eventRule(),
	}
}

// networkPolicyRule: server-side apply of an object that does not exist yet needs create as
// well as patch; delete removes what a deleted template leaves behind. The names of templates'
// policies are not known in advance, so this rule names none.
func networkPolicyRule() rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"},
		Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}}
}

func eventRule() rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}
}

// RBACSubject is who the Roles are bound to.
type RBACSubject struct {
	Kind      string // rbacv1.ServiceAccountKind or rbacv1.UserKind
	Name      string
	Namespace string // of a ServiceAccount
}

// JWKSSecretRule lets Sandgate keep the run tokens' JWKS in the one Secret run_tokens.jwks_secret
// names (server-side apply of a Secret the chart creates empty): patch by name, no read of any
// Secret.
func JWKSSecretRule(name string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{name}, Verbs: []string{"patch"}}
}

// RBAC renders a Role and RoleBinding per namespace of cfg.Namespaces and, when the controller
// is enabled, in Sandgate's namespace, bound to subject. The Role is named "sandgate".
// jwksSecret, when not empty, is the Secret in Sandgate's namespace it keeps the run tokens'
// JWKS in (JWKSSecretRule), in that namespace's Role.
func RBAC(cfg config.Kubernetes, subject RBACSubject, jwksSecret ...string) []any {
	var out []any
	add := func(ns string, rules []rbacv1.PolicyRule) {
		meta := metav1.ObjectMeta{Name: "sandgate", Namespace: ns, Labels: map[string]string{LabelManagedBy: ManagedByValue}}
		out = append(out,
			&rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta, Rules: rules},
			&rbacv1.RoleBinding{
				TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
				ObjectMeta: meta,
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sandgate"},
				Subjects:   []rbacv1.Subject{subjectOf(subject)},
			})
	}
	controller := cfg.Controller.Enabled
	var jwks []rbacv1.PolicyRule
	for _, name := range jwksSecret {
		if name != "" {
			jwks = append(jwks, JWKSSecretRule(name))
		}
	}
	for _, ns := range cfg.Namespaces {
		rules := SandboxNamespaceRules(controller) // a superset of SandgateNamespaceRules
		if ns == cfg.Sandgate.Namespace {
			rules = append(rules, jwks...)
		}
		add(ns, rules)
	}
	if !slices.Contains(cfg.Namespaces, cfg.Sandgate.Namespace) {
		var rules []rbacv1.PolicyRule
		if controller {
			rules = SandgateNamespaceRules()
		}
		if rules = append(rules, jwks...); len(rules) > 0 {
			add(cfg.Sandgate.Namespace, rules)
		}
	}
	return out
}

func subjectOf(s RBACSubject) rbacv1.Subject {
	if s.Kind == rbacv1.UserKind {
		return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: s.Name}
	}
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: s.Name, Namespace: s.Namespace}
}
