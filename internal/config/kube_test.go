package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKubernetesDefaults(t *testing.T) {
	c, err := Parse([]byte("kubernetes:\n  enabled: true\n  namespaces: [sandboxes]\n"), "/etc/sandgate")
	require.NoError(t, err)
	k := c.Kubernetes
	assert.Equal(t, "sandgate", k.Sandgate.Namespace)
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "sandgate"}, k.Sandgate.PodSelector)
	assert.Equal(t, KubePorts{MCP: 8080, Proxy: 3128, Admin: 9090}, k.Sandgate.Ports)
	assert.Equal(t, map[string]string{"k8s-app": "kube-dns"}, k.DNS.PodSelector)
	assert.True(t, k.DNS.Allowed(), "sandboxes can resolve Sandgate's Service name unless told otherwise")
	c, err = Parse([]byte("kubernetes:\n  enabled: true\n  namespaces: [sandboxes]\n  dns: {allow: false}\n"), "/etc/sandgate")
	require.NoError(t, err)
	assert.False(t, c.Kubernetes.DNS.Allowed(), "allow: false closes it")
	assert.Equal(t, "10m0s", k.Controller.Resync.D().String())
}

func TestKubernetesValidation(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // substrings of the error, each naming its field
	}{
		{"disabled needs nothing", "kubernetes: {}", nil},
		{"enabled without namespaces is refused",
			"kubernetes: {enabled: true}", []string{"kubernetes.namespaces: list at least one namespace"}},
		{"controller without the resolver is refused",
			"kubernetes: {controller: {enabled: true}, namespaces: [a]}", []string{"kubernetes.controller.enabled: needs kubernetes.enabled: true"}},
		{"a namespace that is not a DNS label names its index",
			"kubernetes: {enabled: true, namespaces: [ok, Not_OK]}", []string{`kubernetes.namespaces[1]: "Not_OK" is not a namespace name`}},
		{"a namespace listed twice is refused",
			"kubernetes: {enabled: true, namespaces: [a, a]}", []string{`kubernetes.namespaces[1]: "a" is already listed as kubernetes.namespaces[0]`}},
		{"the admin port may not equal a sandbox-facing port",
			"kubernetes: {enabled: true, namespaces: [a], sandgate: {ports: {admin: 8080}}}", []string{"kubernetes.sandgate.ports.admin: 8080 is already the mcp port"}},
		{"a port out of range is refused",
			"kubernetes: {enabled: true, namespaces: [a], sandgate: {ports: {proxy: 70000}}}", []string{"kubernetes.sandgate.ports.proxy: 70000 is not a port"}},
		{"an invalid label key in a selector is refused",
			"kubernetes: {enabled: true, namespaces: [a], sandgate: {pod_selector: {'bad key': x}}}", []string{`kubernetes.sandgate.pod_selector: key "bad key"`}},
		{"a peer without name or selectors is refused twice",
			"kubernetes: {enabled: true, namespaces: [a], ingress_from: [{}]}", []string{"kubernetes.ingress_from[0].name: must not be empty", "kubernetes.ingress_from[0]: set namespace_selector or pod_selector"}},
		{"duplicate monitoring peer names are refused",
			"kubernetes: {enabled: true, namespaces: [a], monitoring: [{name: p, pod_selector: {a: b}}, {name: p, pod_selector: {a: c}}]}", []string{`kubernetes.monitoring[1].name: "p" is already used by kubernetes.monitoring[0]`}},
		{"an invalid peer port names its index",
			"kubernetes: {enabled: true, namespaces: [a], ingress_from: [{name: r, pod_selector: {a: b}, ports: [0]}]}", []string{"kubernetes.ingress_from[0].ports[0]: 0 is not a port"}},
		{"an unknown field is refused by the strict decoder",
			"kubernetes: {enabled: true, namespace: [a]}", []string{`unknown field "kubernetes.namespace"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "/etc/sandgate")
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
