// Package netpoleval decides whether Kubernetes NetworkPolicies allow a connection, by the
// semantics of networking.k8s.io/v1 as documented and as CNIs implement them. It is pure
// computation (no packets, no cluster) and exists so Sandgate's tests can check what the
// rendered policies allow, pair by pair.
//
// The rules implemented:
//   - A pod is isolated for ingress (egress) when at least one policy of its namespace selects
//     it and has Ingress (Egress) among its policyTypes. Empty policyTypes means Ingress, plus
//     Egress when the policy has egress rules.
//   - A non-isolated direction allows everything. An isolated one allows the union of the rules
//     of every policy selecting the pod; a policy with no rules allows nothing.
//   - A rule with no peers matches every peer; with no ports, every port. Peers of a rule are
//     OR-ed; namespaceSelector and podSelector inside one peer are AND-ed; a podSelector alone
//     means the policy's own namespace; an empty selector matches everything it ranges over.
//   - ipBlock matches by address: in cidr and in none of except. Only ipBlock matches an
//     endpoint outside the cluster.
//   - A port matches by protocol (default TCP), then number, endPort range, or name (the
//     destination pod's named container port). No port number matches every port.
//   - A connection needs both the source's egress and the destination's ingress.
package netpoleval

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is a pod of the modelled cluster.
type Pod struct {
	Name      string
	Namespace string
	Labels    map[string]string
	IP        netip.Addr
	// Ports are the named container ports, for policies that name a port.
	Ports []corev1.ContainerPort
}

// Endpoint is one end of a connection: a pod, or an address outside the cluster (Pod nil).
type Endpoint struct {
	Pod *Pod
	IP  netip.Addr
}

// PodEndpoint is the endpoint of a pod.
func PodEndpoint(p *Pod) Endpoint { return Endpoint{Pod: p, IP: p.IP} }

// External is an address that belongs to no pod.
func External(ip string) Endpoint { return Endpoint{IP: netip.MustParseAddr(ip)} }

// Connection is a new connection from From to To's Port.
type Connection struct {
	From, To Endpoint
	Protocol corev1.Protocol // "" is TCP
	Port     int32
}

// Cluster is the modelled state: namespace labels and the policies.
type Cluster struct {
	// Namespaces maps a namespace to its labels; kubernetes.io/metadata.name is implied.
	Namespaces map[string]map[string]string
	Policies   []*networkingv1.NetworkPolicy
}

// Allowed reports whether the connection is allowed by egress of its source and ingress of its
// destination.
func (c Cluster) Allowed(conn Connection) bool {
	return c.EgressAllowed(conn) && c.IngressAllowed(conn)
}

// EgressAllowed reports whether the source's egress policies allow the connection.
func (c Cluster) EgressAllowed(conn Connection) bool {
	src := conn.From.Pod
	if src == nil {
		return true
	}
	isolated := false
	for _, np := range c.Policies {
		if np.Namespace != src.Namespace || !affects(np, networkingv1.PolicyTypeEgress) || !matches(&np.Spec.PodSelector, src.Labels) {
			continue
		}
		isolated = true
		for _, r := range np.Spec.Egress {
			if c.peersMatch(np.Namespace, r.To, conn.To) && portsMatch(r.Ports, conn, conn.To.Pod) {
				return true
			}
		}
	}
	return !isolated
}

// IngressAllowed reports whether the destination's ingress policies allow the connection.
func (c Cluster) IngressAllowed(conn Connection) bool {
	dst := conn.To.Pod
	if dst == nil {
		return true
	}
	isolated := false
	for _, np := range c.Policies {
		if np.Namespace != dst.Namespace || !affects(np, networkingv1.PolicyTypeIngress) || !matches(&np.Spec.PodSelector, dst.Labels) {
			continue
		}
		isolated = true
		for _, r := range np.Spec.Ingress {
			if c.peersMatch(np.Namespace, r.From, conn.From) && portsMatch(r.Ports, conn, dst) {
				return true
			}
		}
	}
	return !isolated
}

// affects reports whether np isolates its pods in direction t.
func affects(np *networkingv1.NetworkPolicy, t networkingv1.PolicyType) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return t == networkingv1.PolicyTypeIngress || len(np.Spec.Egress) > 0
	}
	for _, pt := range np.Spec.PolicyTypes {
		if pt == t {
			return true
		}
	}
	return false
}

func (c Cluster) peersMatch(policyNS string, peers []networkingv1.NetworkPolicyPeer, ep Endpoint) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if c.peerMatches(policyNS, p, ep) {
			return true
		}
	}
	return false
}

func (c Cluster) peerMatches(policyNS string, p networkingv1.NetworkPolicyPeer, ep Endpoint) bool {
	if p.IPBlock != nil {
		return ipBlockMatches(p.IPBlock, ep.IP)
	}
	if ep.Pod == nil || (p.PodSelector == nil && p.NamespaceSelector == nil) {
		return false
	}
	if p.NamespaceSelector == nil {
		if ep.Pod.Namespace != policyNS {
			return false
		}
	} else if !matches(p.NamespaceSelector, c.namespaceLabels(ep.Pod.Namespace)) {
		return false
	}
	return p.PodSelector == nil || matches(p.PodSelector, ep.Pod.Labels)
}

func (c Cluster) namespaceLabels(ns string) map[string]string {
	out := map[string]string{"kubernetes.io/metadata.name": ns}
	for k, v := range c.Namespaces[ns] {
		out[k] = v
	}
	return out
}

func ipBlockMatches(b *networkingv1.IPBlock, ip netip.Addr) bool {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !ip.IsValid() || !cidr.Contains(ip) {
		return false
	}
	for _, e := range b.Except {
		if ex, err := netip.ParsePrefix(e); err == nil && ex.Contains(ip) {
			return false
		}
	}
	return true
}

// portsMatch checks the connection's destination port; named ports are looked up on dst.
func portsMatch(ports []networkingv1.NetworkPolicyPort, conn Connection, dst *Pod) bool {
	if len(ports) == 0 {
		return true
	}
	proto := conn.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, p := range ports {
		want := corev1.ProtocolTCP
		if p.Protocol != nil {
			want = *p.Protocol
		}
		if want != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String: // a named port of the destination pod
			if dst == nil {
				continue
			}
			for _, cp := range dst.Ports {
				cpProto := cp.Protocol
				if cpProto == "" {
					cpProto = corev1.ProtocolTCP
				}
				if cp.Name == p.Port.StrVal && cp.ContainerPort == conn.Port && cpProto == proto {
					return true
				}
			}
		case p.EndPort != nil:
			if conn.Port >= p.Port.IntVal && conn.Port <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == conn.Port:
			return true
		}
	}
	return false
}

func matches(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false // an invalid selector is rejected by the apiserver; never match here
	}
	return s.Matches(labels.Set(l))
}
