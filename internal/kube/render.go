package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandgate/sandgate/internal/config"
)

// Names of the NetworkPolicies Sandgate creates.
const (
	// NamespaceDenyName is the deny-all policy for every sandbox pod of a namespace.
	NamespaceDenyName = "sandgate-sandbox-default-deny"
	// SandgateIngressName is the ingress policy of Sandgate's own pods.
	SandgateIngressName = "sandgate-ingress"
	// templatePolicyPrefix + template name names the policy of an Unmanaged template.
	templatePolicyPrefix = "sandgate-template-"
	// AnnotationTemplate on a per-template NetworkPolicy names its SandboxTemplate.
	AnnotationTemplate = "sandgate.dev/template"
)

// Desired is everything Sandgate keeps applied for a configuration and a set of templates.
type Desired struct {
	// NetworkPolicies are created and owned by Sandgate (LabelManagedBy).
	NetworkPolicies []*networkingv1.NetworkPolicy
	// Templates are the spec.networkPolicy of Managed templates.
	Templates []TemplateApply
	// Collisions are the templates that get nothing because the name of their NetworkPolicy
	// is already another template's. Not expected with TemplatePolicyName, never resolved by
	// taking turns: the first template by name keeps the policy.
	Collisions []Collision
}

// Collision is a template refused because its object's name is another template's.
type Collision struct {
	Kind      string // of the object: NetworkPolicy
	Namespace string
	Name      string // of the object
	Template  string // refused
	Holder    string // the template that has the name
}

// Render returns the rules for templates and for every namespace of cfg.Namespaces: per
// template its rules, per namespace the sandbox deny-all, and Sandgate's ingress policy.
// Templates outside cfg.Namespaces are ignored. The output is sorted, so equal inputs render
// byte-identical YAML.
func Render(cfg config.Kubernetes, templates []Template) Desired {
	var d Desired
	for _, ns := range cfg.Namespaces {
		nd := RenderNamespace(cfg, ns, templates)
		d.NetworkPolicies = append(d.NetworkPolicies, nd.NetworkPolicies...)
		d.Templates = append(d.Templates, nd.Templates...)
		d.Collisions = append(d.Collisions, nd.Collisions...)
	}
	d.NetworkPolicies = append(d.NetworkPolicies, SandgateIngress(cfg))
	return d
}

// RenderNamespace returns the rules of one sandbox namespace: the deny-all and the rules of
// the templates in ns (templates of other namespaces are ignored).
func RenderNamespace(cfg config.Kubernetes, ns string, templates []Template) Desired {
	d := Desired{NetworkPolicies: []*networkingv1.NetworkPolicy{NamespaceDeny(ns)}}
	ts := slices.Clone(templates)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	var owned []*networkingv1.NetworkPolicy
	for _, t := range ts {
		if t.Namespace != ns {
			continue
		}
		td := RenderTemplate(cfg, t)
		owned = append(owned, td.NetworkPolicies...)
		d.Templates = append(d.Templates, td.Templates...)
	}
	nps, collisions := firstTakesName(owned)
	d.NetworkPolicies = append(d.NetworkPolicies, nps...)
	d.Collisions = collisions
	return d
}

// firstTakesName keeps the first of per-template policies (in template order) that share a
// name and reports the others as collisions: no two templates ever take turns at one name.
func firstTakesName(nps []*networkingv1.NetworkPolicy) ([]*networkingv1.NetworkPolicy, []Collision) {
	holder := map[string]string{}
	var kept []*networkingv1.NetworkPolicy
	var collisions []Collision
	for _, np := range nps {
		tpl := np.Annotations[AnnotationTemplate]
		if h, taken := holder[np.Name]; taken {
			collisions = append(collisions, Collision{Kind: "NetworkPolicy", Namespace: np.Namespace, Name: np.Name, Template: tpl, Holder: h})
			continue
		}
		holder[np.Name] = tpl
		kept = append(kept, np)
	}
	return kept, collisions
}

// RenderTemplate returns the rules of one template: spec.networkPolicy for a Managed one, a
// NetworkPolicy of Sandgate's for an Unmanaged one.
func RenderTemplate(cfg config.Kubernetes, t Template) Desired {
	spec := SandboxRules(cfg)
	if t.Management == Unmanaged {
		return Desired{NetworkPolicies: []*networkingv1.NetworkPolicy{TemplatePolicy(t.Namespace, t.Name, spec, true)}}
	}
	return Desired{Templates: []TemplateApply{{Namespace: t.Namespace, Name: t.Name, Spec: spec}}}
}

// SandboxRules are the rules of every templated sandbox: egress only to Sandgate's MCP and proxy
// ports (and the cluster DNS on port 53 when cfg.DNS.Allowed()), ingress only from the
// cfg.IngressFrom peers.
func SandboxRules(cfg config.Kubernetes) TemplateNetworkPolicySpec {
	spec := TemplateNetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: namespaceIs(cfg.Sandgate.Namespace),
				PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(cfg.Sandgate.PodSelector)},
			}},
			Ports: tcpPorts(cfg.Sandgate.Ports.MCP, cfg.Sandgate.Ports.Proxy),
		}},
	}
	if cfg.DNS.Allowed() {
		spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: maps.Clone(cfg.DNS.NamespaceSelector)},
				PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(cfg.DNS.PodSelector)},
			}},
			Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, 53), port(corev1.ProtocolTCP, 53)},
		})
	}
	for _, p := range cfg.IngressFrom {
		spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{peer(p)},
			Ports: tcpPorts(p.Ports...),
		})
	}
	return spec
}

// TemplatePolicy is a NetworkPolicy with the rules of spec for the pods of template name:
// those labelled LabelTemplateRefHash=TemplateRefHash(name). With owned it is Sandgate's
// policy of an Unmanaged template; without, it is the policy the Agent Sandbox controller
// creates for a Managed template, which Sandgate only evaluates and never applies.
func TemplatePolicy(ns, name string, spec TemplateNetworkPolicySpec, owned bool) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      TemplatePolicyName(name),
			Namespace: ns,
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelTemplateRefHash: TemplateRefHash(name)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     slices.Clone(spec.Ingress),
			Egress:      slices.Clone(spec.Egress),
		},
	}
	if owned {
		np.Labels = ownedLabels(RoleTemplate)
		np.Annotations = map[string]string{AnnotationTemplate: name}
	}
	return np
}

// maxNameLen is the longest name of a NetworkPolicy (a DNS subdomain).
const maxNameLen = 253

// TemplatePolicyName names Sandgate's NetworkPolicy of an Unmanaged template: the prefix and
// the template's whole name when that fits, else as much of the name as fits with "-" and 32
// hex digits (128 bits) of its SHA-256, so that two long names sharing a prefix (or a 32-bit
// hash, as the template-ref-hash label does) never share a policy. The controller still refuses
// a second template whose policy name is taken (Desired.Collisions).
func TemplatePolicyName(template string) string {
	if len(templatePolicyPrefix)+len(template) <= maxNameLen {
		return templatePolicyPrefix + template
	}
	sum := sha256.Sum256([]byte(template))
	suffix := "-" + hex.EncodeToString(sum[:16])
	head := strings.TrimRight(template[:maxNameLen-len(templatePolicyPrefix)-len(suffix)], ".-")
	return templatePolicyPrefix + head + suffix
}

// NamespaceDeny denies all ingress and egress of every sandbox pod in ns, templated or not.
// Policies add up, so a template's rules still apply to its own pods; a sandbox created without
// a template reaches nothing.
func NamespaceDeny(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: NamespaceDenyName, Namespace: ns, Labels: ownedLabels(RoleNamespaceDeny)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: LabelSandboxNameHash, Operator: metav1.LabelSelectorOpExists},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// SandgateIngress is the ingress policy of Sandgate's pods: sandbox pods of cfg.Namespaces reach
// the MCP and proxy ports, the cfg.Monitoring peers the admin port, nothing else reaches them.
// Sandgate's egress is not restricted here.
func SandgateIngress(cfg config.Kubernetes) *networkingv1.NetworkPolicy {
	var sandboxes []networkingv1.NetworkPolicyPeer
	for _, ns := range cfg.Namespaces {
		sandboxes = append(sandboxes, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: namespaceIs(ns),
			PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: LabelSandboxNameHash, Operator: metav1.LabelSelectorOpExists},
			}},
		})
	}
	ingress := []networkingv1.NetworkPolicyIngressRule{}
	if len(sandboxes) > 0 {
		ingress = append(ingress, networkingv1.NetworkPolicyIngressRule{
			From:  sandboxes,
			Ports: tcpPorts(cfg.Sandgate.Ports.MCP, cfg.Sandgate.Ports.Proxy),
		})
	}
	for _, p := range cfg.Monitoring {
		ingress = append(ingress, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{peer(p)},
			Ports: tcpPorts(cfg.Sandgate.Ports.Admin),
		})
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: SandgateIngressName, Namespace: cfg.Sandgate.Namespace, Labels: ownedLabels(RoleIngress)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: maps.Clone(cfg.Sandgate.PodSelector)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     ingress,
		},
	}
}

func ownedLabels(role string) map[string]string {
	return map[string]string{LabelManagedBy: ManagedByValue, LabelRole: role}
}

// peer turns a configured peer into a NetworkPolicyPeer. Without a namespace selector the peer
// is in the policy's own namespace, as in Kubernetes.
func peer(p config.KubePeer) networkingv1.NetworkPolicyPeer {
	var out networkingv1.NetworkPolicyPeer
	if len(p.NamespaceSelector) > 0 {
		out.NamespaceSelector = &metav1.LabelSelector{MatchLabels: maps.Clone(p.NamespaceSelector)}
	}
	out.PodSelector = &metav1.LabelSelector{MatchLabels: maps.Clone(p.PodSelector)}
	return out
}

func namespaceIs(ns string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{LabelNamespaceName: ns}}
}

func tcpPorts(ports ...int32) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for _, p := range ports {
		out = append(out, port(corev1.ProtocolTCP, p))
	}
	return out
}

func port(proto corev1.Protocol, p int32) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(p)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}
