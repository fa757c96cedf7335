package kube

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/kube/netpoleval"
	"github.com/sandgate/sandgate/test/kubetest"
)

// testConfig is the configuration of the semantics and apiserver tests: sandboxes in
// "sandboxes", Sandgate in "sandgate", a router allowed in, Prometheus allowed to the admin port.
func testConfig(dns bool) config.Kubernetes {
	return config.Kubernetes{
		Enabled:    true,
		Namespaces: []string{"sandboxes"},
		Sandgate: config.KubeSandgate{
			Namespace:   "sandgate",
			PodSelector: map[string]string{"app.kubernetes.io/name": "sandgate"},
			Ports:       config.KubePorts{MCP: 8080, Proxy: 3128, Admin: 9090},
		},
		DNS: config.KubeDNS{Allow: &dns,
			NamespaceSelector: map[string]string{LabelNamespaceName: "kube-system"},
			PodSelector:       map[string]string{"k8s-app": "kube-dns"}},
		IngressFrom: []config.KubePeer{{Name: "router",
			NamespaceSelector: map[string]string{LabelNamespaceName: "router"},
			PodSelector:       map[string]string{"app": "sandbox-router"}}},
		Monitoring: []config.KubePeer{{Name: "prometheus",
			NamespaceSelector: map[string]string{LabelNamespaceName: "monitoring"},
			PodSelector:       map[string]string{"app": "prometheus"}}},
		Controller: config.KubeController{Enabled: true},
	}
}

// TestRenderedPoliciesAllowExactlyTheIntendedPairs evaluates every (source, destination, port)
// of a small cluster against the rendered policies plus the policy the Agent Sandbox controller
// creates from a Managed template's spec.networkPolicy, and compares with the intent written
// out independently below.
func TestRenderedPoliciesAllowExactlyTheIntendedPairs(t *testing.T) {
	testRenderedPolicies(t, false)
}

// TestRenderedPoliciesAgreeWithCyclonus is the same matrix, every cell also asked of cyclonus.
func TestRenderedPoliciesAgreeWithCyclonus(t *testing.T) {
	testRenderedPolicies(t, true)
}

func testRenderedPolicies(t *testing.T, crossCheck bool) {
	pod := func(name, ns string, ip string, labels map[string]string) *netpoleval.Pod {
		return &netpoleval.Pod{Name: name, Namespace: ns, Labels: labels, IP: netip.MustParseAddr(ip)}
	}
	sandbox := func(name, template string) map[string]string {
		l := map[string]string{LabelSandboxNameHash: TemplateRefHash(name)}
		if template != "" {
			l[LabelTemplateRefHash] = TemplateRefHash(template)
		}
		return l
	}
	managed := pod("managed-sandbox", "sandboxes", "10.1.0.1", sandbox("s1", "coder"))
	unmanaged := pod("unmanaged-sandbox", "sandboxes", "10.1.0.2", sandbox("s2", "cilium-coder"))
	untemplated := pod("bare-sandbox", "sandboxes", "10.1.0.3", sandbox("s3", ""))
	neighbour := pod("neighbour", "sandboxes", "10.1.0.4", map[string]string{"app": "batch"})
	sandgate := pod("sandgate", "sandgate", "10.2.0.1", map[string]string{"app.kubernetes.io/name": "sandgate"})
	dns := pod("kube-dns", "kube-system", "10.3.0.10", map[string]string{"k8s-app": "kube-dns"})
	router := pod("router", "router", "10.4.0.1", map[string]string{"app": "sandbox-router"})
	prometheus := pod("prometheus", "monitoring", "10.5.0.1", map[string]string{"app": "prometheus"})
	other := pod("other", "default", "10.6.0.1", map[string]string{"app": "web"})
	// A pod carrying the router's labels in the wrong namespace is not the router.
	impostor := pod("impostor", "default", "10.6.0.2", map[string]string{"app": "sandbox-router"})

	type endpoint struct {
		name string
		ep   netpoleval.Endpoint
	}
	eps := []endpoint{}
	for _, p := range []*netpoleval.Pod{managed, unmanaged, untemplated, neighbour, sandgate, dns, router, prometheus, other, impostor} {
		eps = append(eps, endpoint{p.Name, netpoleval.PodEndpoint(p)})
	}
	eps = append(eps, endpoint{"metadata", netpoleval.External("169.254.169.254")}, endpoint{"public", netpoleval.External("203.0.113.7")})
	ports := []struct {
		proto corev1.Protocol
		port  int32
	}{{corev1.ProtocolTCP, 8080}, {corev1.ProtocolTCP, 3128}, {corev1.ProtocolTCP, 9090}, {corev1.ProtocolUDP, 53}, {corev1.ProtocolTCP, 53}, {corev1.ProtocolTCP, 443}, {corev1.ProtocolTCP, 80}}

	isSandbox := func(name string) bool { return name == managed.Name || name == unmanaged.Name }
	for _, dnsAllowed := range []bool{false, true} {
		cfg := testConfig(dnsAllowed)
		d := Render(cfg, []Template{
			{Namespace: "sandboxes", Name: "coder", Management: Managed},
			{Namespace: "sandboxes", Name: "cilium-coder", Management: Unmanaged},
		})
		policies := append([]*networkingv1.NetworkPolicy(nil), d.NetworkPolicies...)
		for _, ta := range d.Templates {
			policies = append(policies, TemplatePolicy(ta.Namespace, ta.Name, ta.Spec, false))
		}
		cluster := netpoleval.Cluster{Policies: policies}

		// intended is the whole intent: templated sandboxes reach Sandgate's MCP and proxy ports
		// (and DNS if allowed) and are reached by the router only; Sandgate is reached by
		// sandboxes on MCP/proxy and by Prometheus on admin; untemplated sandboxes are cut off;
		// everything else among non-sandbox, non-Sandgate pods is untouched.
		intended := func(src, dst string, proto corev1.Protocol, port int32) bool {
			switch {
			case src == untemplated.Name || dst == untemplated.Name:
				return false
			case isSandbox(src):
				if dst == sandgate.Name {
					return proto == corev1.ProtocolTCP && (port == 8080 || port == 3128)
				}
				return dnsAllowed && dst == dns.Name && port == 53
			case isSandbox(dst):
				return src == router.Name
			case dst == sandgate.Name:
				return src == prometheus.Name && proto == corev1.ProtocolTCP && port == 9090
			default:
				return true
			}
		}
		var names []string
		var traffic []kubetest.CyclonusTraffic
		var ours []bool
		for _, src := range eps {
			if src.ep.Pod == nil {
				continue // traffic from outside the cluster is not modelled (no LoadBalancer)
			}
			for _, dst := range eps {
				for _, p := range ports {
					name := fmt.Sprintf("dns=%v %s to %s %s/%d", dnsAllowed, src.name, dst.name, p.proto, p.port)
					conn := netpoleval.Connection{From: src.ep, To: dst.ep, Protocol: p.proto, Port: p.port}
					got := cluster.Allowed(conn)
					assert.Equal(t, intended(src.name, dst.name, p.proto, p.port), got, name)
					names, ours = append(names, name), append(ours, got)
					traffic = append(traffic, cyclonusTraffic(conn))
				}
			}
		}
		// The same cells, asked of cyclonus, an evaluator written independently of netpoleval.
		if crossCheck {
			theirs := kubetest.Cyclonus(t, policies, traffic)
			for i := range names {
				assert.Equal(t, ours[i], theirs[i], "netpoleval and cyclonus disagree: %s", names[i])
			}
		}
	}
}

// cyclonusTraffic is conn for kubetest.Cyclonus (namespaces carry only their name label here).
func cyclonusTraffic(conn netpoleval.Connection) kubetest.CyclonusTraffic {
	peer := func(e netpoleval.Endpoint) kubetest.CyclonusPeer {
		if e.Pod == nil {
			return kubetest.CyclonusPeer{External: true, IP: e.IP.String()}
		}
		return kubetest.CyclonusPeer{IP: e.IP.String(), Namespace: e.Pod.Namespace,
			NamespaceLabels: map[string]string{LabelNamespaceName: e.Pod.Namespace}, PodLabels: e.Pod.Labels}
	}
	proto := conn.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	return kubetest.CyclonusTraffic{Source: peer(conn.From), Destination: peer(conn.To), Port: int(conn.Port), Protocol: string(proto)}
}
