package kube

import (
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/config"
)

// The chart's ValidatingAdmissionPolicy (charts/sandgate/templates/admission-policy.yaml)
// refuses a Managed SandboxTemplate in a sandbox namespace whose spec.networkPolicy is not
// Sandgate's rules: without it a template created before Sandgate's controller writes the rules
// gives its first sandboxes the Agent Sandbox controller's default (internet egress). CEL cannot
// parse JSON, so the policy compares a canonical string it builds from the template with the
// one Sandgate keeps in the ConfigMap RulesConfigMapName of its namespace (RulesConfigMap).
// CanonicalRules and the policy's CEL are one format written twice; test/deploy checks that
// they agree on a real apiserver.
const (
	// RulesConfigMapName is the ConfigMap the admission policy takes as its parameter.
	RulesConfigMapName = "sandgate-template-rules"
	// RulesConfigMapKey is the key of the canonical rules in it.
	RulesConfigMapKey = "rules"
)

// RulesConfigMap is the admission policy's parameter for cfg: CanonicalRules(SandboxRules(cfg)),
// in Sandgate's namespace.
func RulesConfigMap(cfg config.Kubernetes) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: RulesConfigMapName, Namespace: cfg.Sandgate.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedByValue, LabelRole: RoleTemplateRules}},
		Data: map[string]string{RulesConfigMapKey: CanonicalRules(SandboxRules(cfg))},
	}
}

// RulesConfigMapStub is RulesConfigMapName in ns without data: what an administrator creates
// (the chart does) so that Sandgate, which may patch that one ConfigMap and create none, can
// fill it. Until it has, the admission policy refuses every Managed template.
func RulesConfigMapStub(ns string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: RulesConfigMapName, Namespace: ns, Labels: map[string]string{LabelRole: RoleTemplateRules}},
	}
}

// CanonicalRules writes spec in the admission policy's canonical form:
//
//	ingress=RULE;RULE…|egress=RULE;RULE…
//	RULE  = ports:PORT,PORT…/peers:PEER,PEER…
//	PORT  = PROTOCOL:PORT:ENDPORT        (protocol TCP when absent, the others "" when absent)
//	PEER  = nsSEL podSEL ipBLOCK        (each "-" when absent)
//	SEL   = {k=v&k=v…#key OP v+v&…}     (matchLabels sorted by key, expressions in order)
//	BLOCK = {CIDR#except+except…}
//
// Lists keep their order: Sandgate renders them deterministically.
func CanonicalRules(spec TemplateNetworkPolicySpec) string {
	ingress := make([]string, 0, len(spec.Ingress))
	for _, r := range spec.Ingress {
		ingress = append(ingress, canonicalRule(r.Ports, r.From))
	}
	egress := make([]string, 0, len(spec.Egress))
	for _, r := range spec.Egress {
		egress = append(egress, canonicalRule(r.Ports, r.To))
	}
	return "ingress=" + strings.Join(ingress, ";") + "|egress=" + strings.Join(egress, ";")
}

func canonicalRule(ports []networkingv1.NetworkPolicyPort, peers []networkingv1.NetworkPolicyPeer) string {
	ps := make([]string, 0, len(ports))
	for _, p := range ports {
		proto := "TCP"
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		port, end := "", ""
		if p.Port != nil {
			port = p.Port.String()
		}
		if p.EndPort != nil {
			end = strconv.Itoa(int(*p.EndPort))
		}
		ps = append(ps, proto+":"+port+":"+end)
	}
	qs := make([]string, 0, len(peers))
	for _, q := range peers {
		ip := "-"
		if q.IPBlock != nil {
			ip = "{" + q.IPBlock.CIDR + "#" + strings.Join(q.IPBlock.Except, "+") + "}"
		}
		qs = append(qs, "ns"+canonicalSelector(q.NamespaceSelector)+"pod"+canonicalSelector(q.PodSelector)+"ip"+ip)
	}
	return "ports:" + strings.Join(ps, ",") + "/peers:" + strings.Join(qs, ",")
}

func canonicalSelector(s *metav1.LabelSelector) string {
	if s == nil {
		return "-"
	}
	labels := make([]string, 0, len(s.MatchLabels))
	for k, v := range s.MatchLabels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	exprs := make([]string, 0, len(s.MatchExpressions))
	for _, e := range s.MatchExpressions {
		exprs = append(exprs, e.Key+" "+string(e.Operator)+" "+strings.Join(e.Values, "+"))
	}
	return "{" + strings.Join(labels, "&") + "#" + strings.Join(exprs, "&") + "}"
}
