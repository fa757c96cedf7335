package identity

import (
	"fmt"
	"hash/fnv"
)

// The Agent Sandbox vocabulary the Kubernetes resolver reads. Package kube re-exports it; package
// kubeid (the resolver) reads it.
const (
	// LabelSandboxNameHash is on every sandbox pod; only pods carrying it are watched.
	LabelSandboxNameHash = "agents.x-k8s.io/sandbox-name-hash"
	// AnnotationTemplateRef on a Sandbox names the SandboxTemplate it was created from. Whoever
	// creates a Sandbox can write it: it is never evidence of a template on its own.
	AnnotationTemplateRef = "agents.x-k8s.io/sandbox-template-ref"
	// LabelTemplateRefHash is on the pods of sandboxes created from a template: TemplateRefHash
	// of the template name. The controller maintains it on pods (a Sandbox's pod template cannot
	// set it) and only for sandboxes controlled by a SandboxClaim or SandboxWarmPool.
	LabelTemplateRefHash = "agents.x-k8s.io/sandbox-template-ref-hash"
	// SandboxGroup is the API group of Sandbox; SandboxClaimGroup that of SandboxClaim.
	SandboxGroup      = "agents.x-k8s.io"
	SandboxClaimGroup = "extensions.agents.x-k8s.io"
)

// NameHash is the Agent Sandbox controller's NameHash: FNV-1a 32-bit of a name, eight lowercase
// hex digits. It is the value of LabelSandboxNameHash for a Sandbox's name and of
// LabelTemplateRefHash for a template's.
func NameHash(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%08x", h.Sum32())
}
