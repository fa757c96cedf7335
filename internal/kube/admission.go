package kube

import (
	"sort"
	"strconv"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The chart's ValidatingAdmissionPolicy (charts/sandgate/templates/admission-policy.yaml)
// refuses a Managed SandboxTemplate in a sandbox namespace whose spec.networkPolicy is not
// Sandgate's rules: without it a template created before Sandgate's controller writes the rules
// gives its first sandboxes the Agent Sandbox controller's default (internet egress). CEL cannot
// parse JSON, so the policy compares a canonical string it builds from the template with the
// canonical string of the release's rules, which the chart renders into the policy (not a
// parameter: an apiserver stops watching a built-in parameter kind for good once no binding
// uses it, kubernetes/kubernetes#133827). CanonicalRules is that format; the chart writes it
// twice more (the template's CEL, the release's rules in Helm), and test/deploy checks that the
// three agree, for every values file and on a real apiserver.

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
