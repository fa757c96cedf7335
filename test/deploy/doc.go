// Package deploy checks the deployment artefacts against the code they deploy: the Helm chart
// (charts/sandgate) rendered for its default values and every charts/sandgate/ci values file,
// applied to a real kube-apiserver, its config and policies loaded by the real binary built with
// the Makefile's flags, its RBAC and NetworkPolicy compared with the kube package's, the schema's
// refusals, the Dockerfile, and the example SandboxTemplate with its `sandgate netpol` output.
//
// The tests need .tools/bin/helm (test/setup.sh installs it) and, for the apiserver test, the
// kubetest binaries; missing tools skip the tests unless SANDGATE_REQUIRE_TOOLS (helm) or
// SANDGATE_REQUIRE_KUBE (apiserver) is set.
package deploy
