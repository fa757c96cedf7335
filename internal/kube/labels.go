package kube

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sandgate/sandgate/internal/identity"
)

// Labels and annotations the Agent Sandbox controller puts on the objects it creates.
const (
	// LabelSandboxNameHash is on every sandbox pod.
	LabelSandboxNameHash = identity.LabelSandboxNameHash
	// LabelTemplateRefHash is on the pods of sandboxes created from a template: the FNV-1a
	// hash of the template name (TemplateRefHash).
	LabelTemplateRefHash = identity.LabelTemplateRefHash
	// AnnotationTemplateRef on a Sandbox names its SandboxTemplate.
	AnnotationTemplateRef = identity.AnnotationTemplateRef
	// LabelNamespaceName is the label Kubernetes puts on every namespace (since 1.22).
	LabelNamespaceName = "kubernetes.io/metadata.name"
)

// Sandgate's own markers on what it writes.
const (
	// FieldManager is the server-side apply field manager of every write: Sandgate's own, owning
	// exactly what `sandgate netpol` renders (of a template, spec.networkPolicy only). Not
	// "sandgate": a template someone applied whole under that name (as earlier instructions
	// led to) would lose its spec.podTemplate to Sandgate's next apply of spec.networkPolicy.
	FieldManager = "sandgate-netpol"
	// LabelManagedBy marks objects Sandgate created (and may delete).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value.
	ManagedByValue = "sandgate"
	// LabelRole says which rule an object implements (see the Role* constants).
	LabelRole = "sandgate.dev/role"
	// LabelTemplate names the SandboxTemplate a per-template object belongs to.
	LabelTemplate = "sandgate.dev/template"
)

// Values of LabelRole.
const (
	RoleTemplate      = "template"
	RoleNamespaceDeny = "namespace-deny"
	RoleIngress       = "sandgate-ingress"
)

// Agent Sandbox resources Sandgate reads (and, for templates, applies spec.networkPolicy to).
var (
	SandboxGVR         = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	SandboxTemplateGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	SandboxClaimGVR    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	SandboxWarmPoolGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// Kinds of the resources above, as they appear in ownerReferences.
const (
	KindSandbox         = "Sandbox"
	KindSandboxTemplate = "SandboxTemplate"
	KindSandboxClaim    = "SandboxClaim"
)

// TemplateRefHash is the value of LabelTemplateRefHash for a template name.
func TemplateRefHash(template string) string { return identity.NameHash(template) }
