// Package kube renders the Kubernetes objects that confine sandboxes to Sandgate and keeps them
// applied.
//
// Every templated sandbox gets the same rules (SandboxRules): egress only to Sandgate's MCP and
// proxy ports (and the cluster DNS when allowed), ingress only from the configured
// dispatcher/router peers. Where they live depends on the template:
//   - Managed template: Sandgate owns its spec.networkPolicy; the Agent Sandbox controller turns
//     it into the template's shared NetworkPolicy (policyTypes Ingress and Egress).
//   - Unmanaged template: the Agent Sandbox controller creates nothing, so Sandgate creates a
//     NetworkPolicy selecting agents.x-k8s.io/sandbox-template-ref-hash=<FNV-1a of the name>
//     with policyTypes Ingress and Egress.
//
// Per namespace, a deny-all NetworkPolicy covers every sandbox pod (sandboxes created without a
// template included), and in Sandgate's namespace an ingress policy lets sandbox pods reach only
// the MCP and proxy ports and the monitoring peers only the admin port. NetworkPolicies add up,
// so the deny-all never takes away what a template's policy allows.
//
// Everything is written with server-side apply under the field manager "sandgate-netpol"; objects
// Sandgate created carry the label app.kubernetes.io/managed-by=sandgate so the controller can
// find and remove them.
package kube
