package config

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Kubernetes configures the kube side: the pod-IP identity resolver, the NetworkPolicies
// Sandgate renders (sandgate netpol) and the controller that keeps them applied (serve).
//
//	kubernetes:
//	  enabled: true
//	  namespaces: [sandboxes]
//	  sandgate:
//	    namespace: sandgate
//	    pod_selector: {app.kubernetes.io/name: sandgate}
//	  dns: {allow: true}
//	  ingress_from:
//	  - {name: router, namespace_selector: {kubernetes.io/metadata.name: agent-sandbox-system}, pod_selector: {app: sandbox-router}}
//	  monitoring:
//	  - {name: prometheus, namespace_selector: {kubernetes.io/metadata.name: monitoring}}
type Kubernetes struct {
	// Enabled turns on the Kubernetes identity resolver (and the controller when
	// Controller.Enabled). Off by default: the static identity map is the embedded default.
	Enabled bool `json:"enabled"`
	// Kubeconfig is a kubeconfig file; empty uses the in-cluster service account.
	Kubeconfig string `json:"kubeconfig"`
	// Namespaces holds the sandboxes. Sandgate watches pods and templates only there.
	Namespaces []string `json:"namespaces"`
	// Sandgate locates Sandgate's own pods and ports, the only destination sandboxes may reach.
	Sandgate KubeSandgate `json:"sandgate"`
	// DNS optionally lets sandboxes resolve names through the cluster DNS.
	DNS KubeDNS `json:"dns"`
	// IngressFrom are the only peers (dispatchers, routers) that may open connections to
	// sandbox pods.
	IngressFrom []KubePeer `json:"ingress_from"`
	// Monitoring are the only peers that may reach Sandgate's admin port (metrics, health).
	Monitoring []KubePeer `json:"monitoring"`
	// Controller keeps the rendered rules applied from inside `sandgate serve`.
	Controller KubeController `json:"controller"`
}

// KubeSandgate describes Sandgate's own pods.
type KubeSandgate struct {
	// Namespace Sandgate runs in. Default "sandgate".
	Namespace string `json:"namespace"`
	// PodSelector matches Sandgate's pods (matchLabels). Default app.kubernetes.io/name=sandgate.
	PodSelector map[string]string `json:"pod_selector"`
	// Ports are the container ports: mcp 8080, proxy 3128, admin 9090 by default.
	Ports KubePorts `json:"ports"`
}

// KubePorts are Sandgate's container ports as NetworkPolicies name them.
type KubePorts struct {
	MCP   int32 `json:"mcp"`
	Proxy int32 `json:"proxy"`
	Admin int32 `json:"admin"`
}

// KubeDNS allows sandboxes to reach the cluster DNS on port 53 (UDP and TCP).
type KubeDNS struct {
	// Allow defaults to true, as the chart's kubernetes.dns: a sandbox in another namespace can
	// only name Sandgate's Service through DNS (docs/kubernetes.md has the trade-off). Read it
	// with Allowed.
	Allow *bool `json:"allow"`
	// NamespaceSelector and PodSelector locate the DNS pods. Defaults:
	// kubernetes.io/metadata.name=kube-system and k8s-app=kube-dns.
	NamespaceSelector map[string]string `json:"namespace_selector"`
	PodSelector       map[string]string `json:"pod_selector"`
}

// Allowed reports whether sandboxes may reach the cluster DNS (Allow, default true).
func (d KubeDNS) Allowed() bool { return d.Allow == nil || *d.Allow }

// KubePeer is a named set of pods: those matching PodSelector in the namespaces matching
// NamespaceSelector. An empty NamespaceSelector means every namespace; an empty PodSelector
// every pod of those namespaces. Both empty is refused: that would be "the whole cluster".
type KubePeer struct {
	Name              string            `json:"name"`
	NamespaceSelector map[string]string `json:"namespace_selector"`
	PodSelector       map[string]string `json:"pod_selector"`
	// Ports limits the peer to these destination ports (TCP). Empty: every port.
	Ports []int32 `json:"ports"`
}

// KubeController configures the NetworkPolicy controller of `sandgate serve`.
type KubeController struct {
	// Enabled runs the controller. It needs the RBAC rules of `sandgate netpol --rbac`.
	Enabled bool `json:"enabled"`
	// Resync re-applies every rule this often even without a change. Default 10m.
	Resync Duration `json:"resync"`
}

func (x *Kubernetes) applyDefaults(c *Config) {
	if x.Kubeconfig != "" {
		x.Kubeconfig = c.Path(x.Kubeconfig)
	}
	if x.Sandgate.Namespace == "" {
		x.Sandgate.Namespace = "sandgate"
	}
	if len(x.Sandgate.PodSelector) == 0 {
		x.Sandgate.PodSelector = map[string]string{"app.kubernetes.io/name": "sandgate"}
	}
	if x.Sandgate.Ports.MCP == 0 {
		x.Sandgate.Ports.MCP = 8080
	}
	if x.Sandgate.Ports.Proxy == 0 {
		x.Sandgate.Ports.Proxy = 3128
	}
	if x.Sandgate.Ports.Admin == 0 {
		x.Sandgate.Ports.Admin = 9090
	}
	if len(x.DNS.NamespaceSelector) == 0 {
		x.DNS.NamespaceSelector = map[string]string{"kubernetes.io/metadata.name": "kube-system"}
	}
	if len(x.DNS.PodSelector) == 0 {
		x.DNS.PodSelector = map[string]string{"k8s-app": "kube-dns"}
	}
	if x.Controller.Resync == 0 {
		x.Controller.Resync = Duration(10 * time.Minute)
	}
}

func (x *Kubernetes) validate(c *Config, errs *fieldErrors) {
	if (x.Enabled || x.Controller.Enabled) && len(x.Namespaces) == 0 {
		errs.add("kubernetes.namespaces", "list at least one namespace that holds sandboxes")
	}
	if x.Controller.Enabled && !x.Enabled {
		errs.add("kubernetes.controller.enabled", "needs kubernetes.enabled: true")
	}
	seen := map[string]int{}
	for i, ns := range x.Namespaces {
		f := fmt.Sprintf("kubernetes.namespaces[%d]", i)
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs.add(f, "%q is not a namespace name: %s", ns, strings.Join(msgs, "; "))
		}
		if j, dup := seen[ns]; dup {
			errs.add(f, "%q is already listed as kubernetes.namespaces[%d]", ns, j)
		}
		seen[ns] = i
	}
	if msgs := validation.IsDNS1123Label(x.Sandgate.Namespace); len(msgs) > 0 {
		errs.add("kubernetes.sandgate.namespace", "%q is not a namespace name: %s", x.Sandgate.Namespace, strings.Join(msgs, "; "))
	}
	validateLabels("kubernetes.sandgate.pod_selector", x.Sandgate.PodSelector, errs)
	ports := map[string]int32{"mcp": x.Sandgate.Ports.MCP, "proxy": x.Sandgate.Ports.Proxy, "admin": x.Sandgate.Ports.Admin}
	used := map[int32]string{}
	for _, name := range []string{"mcp", "proxy", "admin"} {
		p := ports[name]
		if p < 1 || p > 65535 {
			errs.add("kubernetes.sandgate.ports."+name, "%d is not a port (1-65535)", p)
			continue
		}
		if other, dup := used[p]; dup {
			errs.add("kubernetes.sandgate.ports."+name, "%d is already the %s port; the admin port must stay unreachable from sandboxes", p, other)
		}
		used[p] = name
	}
	validateLabels("kubernetes.dns.namespace_selector", x.DNS.NamespaceSelector, errs)
	validateLabels("kubernetes.dns.pod_selector", x.DNS.PodSelector, errs)
	validatePeers("kubernetes.ingress_from", x.IngressFrom, errs)
	validatePeers("kubernetes.monitoring", x.Monitoring, errs)
	if x.Controller.Resync.D() < 0 {
		errs.add("kubernetes.controller.resync", "must not be negative")
	}
}

func validatePeers(field string, peers []KubePeer, errs *fieldErrors) {
	names := map[string]int{}
	for i, p := range peers {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case p.Name == "":
			errs.add(f+".name", "must not be empty (it names the peer in the rendered policy)")
		case len(validation.IsDNS1123Label(p.Name)) > 0:
			errs.add(f+".name", "%q must be a lowercase DNS label", p.Name)
		}
		if j, dup := names[p.Name]; dup && p.Name != "" {
			errs.add(f+".name", "%q is already used by %s[%d]", p.Name, field, j)
		}
		names[p.Name] = i
		if len(p.NamespaceSelector) == 0 && len(p.PodSelector) == 0 {
			errs.add(f, "set namespace_selector or pod_selector (both empty would admit every pod of the cluster)")
		}
		validateLabels(f+".namespace_selector", p.NamespaceSelector, errs)
		validateLabels(f+".pod_selector", p.PodSelector, errs)
		for j, port := range p.Ports {
			if port < 1 || port > 65535 {
				errs.add(fmt.Sprintf("%s.ports[%d]", f, j), "%d is not a port (1-65535)", port)
			}
		}
	}
}

// validateLabels checks a matchLabels map the way the apiserver would, so a mistake is
// reported at load and not when the first apply fails.
func validateLabels(field string, labels map[string]string, errs *fieldErrors) {
	for k, v := range labels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs.add(field, "key %q: %s", k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			errs.add(field+"."+k, "value %q: %s", v, strings.Join(msgs, "; "))
		}
	}
}
