package netpoleval

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var (
	web = &Pod{Name: "web", Namespace: "a", Labels: map[string]string{"app": "web"}, IP: netip.MustParseAddr("10.0.0.1"),
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}
	db     = &Pod{Name: "db", Namespace: "a", Labels: map[string]string{"app": "db"}, IP: netip.MustParseAddr("10.0.0.2")}
	client = &Pod{Name: "client", Namespace: "b", Labels: map[string]string{"app": "client"}, IP: netip.MustParseAddr("10.0.1.1")}
	other  = &Pod{Name: "other", Namespace: "c", Labels: map[string]string{"app": "client"}, IP: netip.MustParseAddr("10.0.2.1")}
)

func np(ns string, sel metav1.LabelSelector, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, eg []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: types, Ingress: in, Egress: eg}}
}

func app(v string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: map[string]string{"app": v}}
}

func ns(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": name}}
}

func tcp(p int32) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(p)
	proto := corev1.ProtocolTCP
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

func conn(from, to Endpoint, port int32) Connection {
	return Connection{From: from, To: to, Port: port}
}

// allowedCase is one cell of the truth table: policies, a connection, the answer.
type allowedCase struct {
	name     string
	policies []*networkingv1.NetworkPolicy
	conn     Connection
	want     bool
}

// testNamespaces are the namespace labels of every case (kubernetes.io/metadata.name implied).
var testNamespaces = map[string]map[string]string{"c": {"team": "blue"}}

func TestAllowed(t *testing.T) {
	for _, tc := range allowedCases() {
		t.Run(tc.name, func(t *testing.T) {
			c := Cluster{Namespaces: testNamespaces, Policies: tc.policies}
			assert.Equal(t, tc.want, c.Allowed(tc.conn))
		})
	}
}

func allowedCases() []allowedCase {
	udp := corev1.ProtocolUDP
	named := intstr.FromString("http")
	namedDNS := intstr.FromString("dns")
	p8000 := intstr.FromInt32(8000)
	end := int32(8100)
	return []allowedCase{
		{"no policies allow everything", nil, conn(PodEndpoint(client), PodEndpoint(web), 80), true},
		{"empty podSelector with no rules denies all ingress of the namespace",
			[]*networkingv1.NetworkPolicy{np("a", metav1.LabelSelector{}, ingressOnly, nil, nil)},
			conn(PodEndpoint(client), PodEndpoint(db), 5432), false},
		{"a policy of another namespace does not isolate",
			[]*networkingv1.NetworkPolicy{np("b", metav1.LabelSelector{}, both, nil, nil)},
			conn(PodEndpoint(other), PodEndpoint(web), 80), true},
		{"ingress-only policy leaves egress open",
			[]*networkingv1.NetworkPolicy{np("a", metav1.LabelSelector{}, ingressOnly, nil, nil)},
			conn(PodEndpoint(web), External("192.0.2.1"), 443), true},
		{"empty policyTypes without egress rules is ingress only",
			[]*networkingv1.NetworkPolicy{np("a", metav1.LabelSelector{}, nil, nil, nil)},
			conn(PodEndpoint(web), External("192.0.2.1"), 443), true},
		{"empty policyTypes with egress rules isolates egress",
			[]*networkingv1.NetworkPolicy{np("a", metav1.LabelSelector{}, nil, nil,
				[]networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(53)}}})},
			conn(PodEndpoint(web), External("192.0.2.1"), 443), false},
		{"podSelector alone means the policy's namespace",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 80), false},
		{"namespaceSelector and podSelector in one peer are ANDed",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: ns("b"), PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 80), false},
		{"separate peers are ORed",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: ns("b")}, {PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 80), true},
		{"empty namespaceSelector matches every namespace",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}}}, nil)},
			conn(PodEndpoint(other), PodEndpoint(web), 80), true},
		{"matchExpressions Exists selects by key",
			[]*networkingv1.NetworkPolicy{np("a", metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}, ingressOnly, nil, nil)},
			conn(PodEndpoint(client), PodEndpoint(db), 1), false},
		{"ipBlock allows an address in its cidr",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), egressOnly, nil,
				[]networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"169.254.0.0/16"}}}}}})},
			conn(PodEndpoint(web), External("203.0.113.9"), 443), true},
		{"ipBlock except carves out an address",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), egressOnly, nil,
				[]networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"169.254.0.0/16"}}}}}})},
			conn(PodEndpoint(web), External("169.254.169.254"), 80), false},
		{"pod selectors never match an address outside the cluster",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), egressOnly, nil,
				[]networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}}})},
			conn(PodEndpoint(web), External("203.0.113.9"), 443), false},
		{"a port rule refuses another port",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 81), false},
		{"a TCP port rule refuses UDP on the same port",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(53)}}}, nil)},
			Connection{From: PodEndpoint(client), To: PodEndpoint(web), Port: 53, Protocol: udp}, false},
		{"a protocol without port number allows every port of it",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp}}}}, nil)},
			Connection{From: PodEndpoint(client), To: PodEndpoint(web), Port: 5353, Protocol: udp}, true},
		{"endPort allows the range",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &p8000, EndPort: &end}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 8100), true},
		{"endPort refuses past the range",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &p8000, EndPort: &end}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 8101), false},
		{"a named port resolves on the destination pod",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &named}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 80), true},
		{"a named port does not match another number",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &named}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 8080), false},
		{"a named port needs the protocol of the rule",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &namedDNS}}}}, nil)},
			conn(PodEndpoint(client), PodEndpoint(web), 53), false},
		{"multiple policies selecting a pod add up",
			[]*networkingv1.NetworkPolicy{
				np("a", metav1.LabelSelector{}, both, nil, nil),
				np("a", app("web"), ingressOnly, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: ns("b")}}}}, nil),
			},
			conn(PodEndpoint(client), PodEndpoint(web), 80), true},
		{"ingress allowed but source egress denied is refused",
			[]*networkingv1.NetworkPolicy{
				np("b", metav1.LabelSelector{}, egressOnly, nil, nil),
				np("a", app("web"), ingressOnly, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: ns("b")}}}}, nil),
			},
			conn(PodEndpoint(client), PodEndpoint(web), 80), false},
		{"egress allowed but destination ingress denied is refused",
			[]*networkingv1.NetworkPolicy{
				np("b", metav1.LabelSelector{}, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{{}}),
				np("a", app("web"), ingressOnly, nil, nil),
			},
			conn(PodEndpoint(client), PodEndpoint(web), 80), false},
		{"an empty rule allows every peer and port",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), both, []networkingv1.NetworkPolicyIngressRule{{}}, []networkingv1.NetworkPolicyEgressRule{{}})},
			conn(PodEndpoint(web), PodEndpoint(web), 80), true},
		{"namespace labels other than the name are matched",
			[]*networkingv1.NetworkPolicy{np("a", app("web"), ingressOnly,
				[]networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}}}}, nil)},
			conn(PodEndpoint(other), PodEndpoint(web), 80), true},
	}
}
