package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/test/kubetest"
)

const netpolConfig = `
kubernetes:
  enabled: true
  namespaces: [sandboxes]
  dns: {allow: true}
  ingress_from:
  - {name: router, namespace_selector: {kubernetes.io/metadata.name: router}, pod_selector: {app: router}}
`

func TestNetpolOffline(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sandgate.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(netpolConfig), 0o600))
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		env := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
		err := runNetpol(context.Background(), env, append([]string{"--config", cfg}, args...))
		return out.String(), err
	}

	t.Run("an Unmanaged template renders one NetworkPolicy selecting its template hash", func(t *testing.T) {
		out, err := run("--template", "sandboxes/cilium", "--management", "Unmanaged")
		require.NoError(t, err)
		var np networkingv1.NetworkPolicy
		require.NoError(t, yaml.UnmarshalStrict([]byte(out), &np))
		assert.Equal(t, "sandgate-template-cilium", np.Name)
		assert.Len(t, np.Spec.Egress, 2, "Sandgate and DNS")
		assert.NotContains(t, out, "creationTimestamp")
	})
	t.Run("a Managed template renders the SandboxTemplate's spec.networkPolicy", func(t *testing.T) {
		out, err := run("--template", "coder", "--management", "Managed")
		require.NoError(t, err)
		assert.Contains(t, out, "kind: SandboxTemplate")
		assert.Contains(t, out, "networkPolicy:")
	})
	t.Run("--rbac prints a Role and RoleBinding per namespace", func(t *testing.T) {
		out, err := run("--rbac", "--service-account", "sandgate/sg")
		require.NoError(t, err)
		docs := bytes.Split([]byte(out), []byte("---\n"))
		require.Len(t, docs, 4, "sandboxes and sandgate namespaces")
		var rb rbacv1.RoleBinding
		require.NoError(t, yaml.Unmarshal(docs[1], &rb))
		assert.Equal(t, "sg", rb.Subjects[0].Name)
	})
	t.Run("a template outside kubernetes.namespaces is refused", func(t *testing.T) {
		_, err := run("--template", "other/x", "--management", "Managed")
		require.ErrorContains(t, err, `namespace "other" is not in kubernetes.namespaces`)
	})
	t.Run("--management without --template is a usage error", func(t *testing.T) {
		_, err := run("--management", "Managed")
		require.ErrorIs(t, err, errUsage)
	})
}

// The README renders a template's rules and the RBAC from the example config, offline: the
// example lists its sandboxes' namespace although Kubernetes is off.
func TestNetpolRendersTheExampleConfigOffline(t *testing.T) {
	for _, args := range [][]string{
		{"--template", "agents/coding-agent", "--management", "Managed"},
		{"--rbac"},
	} {
		code, out, errOut := runCLI(t, nil, append([]string{"netpol", "--config", repoPath(t, "examples/sandgate.yaml")}, args...)...)
		assert.Equal(t, 0, code, "netpol %v: %s", args, errOut)
		assert.Contains(t, out, "namespace: agents")
	}
}

// TestNetpolAgainstAPIServer reads templates from a real kube-apiserver, prints their rules and
// applies them with --apply.
func TestNetpolAgainstAPIServer(t *testing.T) {
	cluster := kubetest.Start(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	for _, ns := range []string{"sandboxes", "sandgate"} {
		kubetest.Namespace(t, cs, ns, nil)
	}
	kubetest.Template(t, dyn, "sandboxes", "coder", "Managed")
	kubetest.Template(t, dyn, "sandboxes", "cilium", "Unmanaged")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sandgate.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(netpolConfig), 0o600))
	kubeconfig := kubetest.WriteKubeconfig(t, cluster.Admin)
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		env := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
		err := runNetpol(context.Background(), env, append([]string{"--config", cfg, "--kubeconfig", kubeconfig}, args...))
		return out.String(), err
	}

	t.Run("without --template every template of the namespaces is rendered", func(t *testing.T) {
		out, err := run()
		require.NoError(t, err)
		for _, want := range []string{"name: sandgate-sandbox-default-deny", "name: sandgate-template-cilium", "name: sandgate-ingress", "kind: SandboxTemplate", "name: coder"} {
			assert.Contains(t, out, want)
		}
	})
	t.Run("--template reads the template's management from the cluster", func(t *testing.T) {
		out, err := run("--template", "cilium")
		require.NoError(t, err)
		assert.Contains(t, out, "kind: NetworkPolicy")
		assert.NotContains(t, out, "SandboxTemplate")
	})
	t.Run("--apply writes everything with server-side apply", func(t *testing.T) {
		out, err := run("--apply")
		require.NoError(t, err)
		assert.Contains(t, out, "applied 3 NetworkPolicies and 1 SandboxTemplate rule")
		np, err := cs.NetworkingV1().NetworkPolicies("sandboxes").Get(context.Background(), "sandgate-template-cilium", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "sandgate-netpol", np.ManagedFields[0].Manager)
	})
	t.Run("a missing template is an error naming it", func(t *testing.T) {
		_, err := run("--template", "nope")
		require.ErrorContains(t, err, "sandboxes/nope")
	})
}
