package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The canonical form the chart's admission policy builds in CEL (test/deploy checks the two on a
// real apiserver); here, what each part looks like.
func TestCanonicalRules(t *testing.T) {
	udp := corev1.ProtocolUDP
	end := int32(9000)
	p8080 := intstr.FromInt32(8080)
	named := intstr.FromString("dns")
	spec := TemplateNetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "infra", "role": "debugger"}}}},
		}},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Port: &p8080, EndPort: &end}, {Protocol: &udp, Port: &named}},
			To: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
			},
		}},
	}
	assert.Equal(t,
		"ingress=ports:/peers:ns-pod{role=debugger&team=infra#}ip-"+
			"|egress=ports:TCP:8080:9000,UDP:dns:/peers:ns{#k In a+b}pod-ip-,ns-pod-ip{10.0.0.0/8#10.1.0.0/16}",
		CanonicalRules(spec))
	assert.Equal(t, "ingress=|egress=", CanonicalRules(TemplateNetworkPolicySpec{}), "no rules: deny both ways")
}
