// Package kubeid is identity's Kubernetes resolver: it maps a pod IP to the Agent Sandbox behind
// it from informer caches, verifying the chain pod → Sandbox → claim → warm pool → template on
// facts only the controller and the kubelet write (chain.go; docs/kubernetes.md).
//
// It is its own package so that what every request imports (package identity: the Identity, the
// Resolver interface, the static map) does not import client-go: the audit log, policy and both
// halves compile without it, and so does the race build of audit and proxy (issue 39: client-go
// and k8s.io/api were a third of that build's packages).
package kubeid
