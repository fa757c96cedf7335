package netpoleval

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/sandgate/sandgate/test/kubetest"
)

// TestAllowedAgreesWithCyclonus asks cyclonus, an evaluator written independently, every cell of
// TestAllowed's truth table: it must give the table's answer, as this package does.
func TestAllowedAgreesWithCyclonus(t *testing.T) {
	for _, tc := range allowedCases() {
		got := kubetest.Cyclonus(t, tc.policies, []kubetest.CyclonusTraffic{cyclonusTraffic(testNamespaces, tc.conn)})
		assert.Equal(t, tc.want, got[0], "cyclonus: %s", tc.name)
	}
}

// cyclonusTraffic is conn as cyclonus models it, with the namespace labels of namespaces
// (kubernetes.io/metadata.name added) and the destination's name for the port, if any.
func cyclonusTraffic(namespaces map[string]map[string]string, conn Connection) kubetest.CyclonusTraffic {
	peer := func(e Endpoint) kubetest.CyclonusPeer {
		if e.Pod == nil {
			return kubetest.CyclonusPeer{External: true, IP: e.IP.String()}
		}
		nsLabels := map[string]string{"kubernetes.io/metadata.name": e.Pod.Namespace}
		for k, v := range namespaces[e.Pod.Namespace] {
			nsLabels[k] = v
		}
		return kubetest.CyclonusPeer{IP: e.IP.String(), Namespace: e.Pod.Namespace, NamespaceLabels: nsLabels, PodLabels: e.Pod.Labels}
	}
	proto := conn.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	name := ""
	if conn.To.Pod != nil {
		for _, p := range conn.To.Pod.Ports {
			pp := p.Protocol
			if pp == "" {
				pp = corev1.ProtocolTCP
			}
			if p.ContainerPort == conn.Port && pp == proto {
				name = p.Name
			}
		}
	}
	return kubetest.CyclonusTraffic{Source: peer(conn.From), Destination: peer(conn.To), Port: int(conn.Port), PortName: name, Protocol: string(proto)}
}
