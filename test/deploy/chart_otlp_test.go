package deploy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/sandgate/sandgate/internal/config"
)

// audit.otlp's values become the config's audit.otlp, and its authSecret a credential whose file
// is the Secret's key, mounted read-only: the token reaches Sandgate only through a file it
// re-reads, never through the ConfigMap.
func TestChartOTLPAuthHeaderFromSecret(t *testing.T) {
	objs := render(t, chartCase{name: "otlp"}, "sandgate", "sandgate")
	assert.NotContains(t, configMapData(t, one(t, objs, "ConfigMap", "-config"))["sandgate.yaml"], "otlp",
		"no endpoint: no exporter")

	args := append([]string{"template", "sandgate", chartDir, "--namespace", "sandgate"}, valuesArgs(chartCase{},
		"audit.otlp.endpoint=https://otel-collector.observability:4318", "audit.otlp.protocol=grpc",
		"audit.otlp.authSecret.name=sandgate-otlp", "audit.otlp.authSecret.key=token",
		"audit.otlp.authSecret.header=X-Api-Key", "audit.otlp.headers.X-Scope-OrgID=security")...)
	out, errOut, err := helm(t, args...)
	require.NoError(t, err, errOut)
	objs = parseObjects(t, out)
	doc := configMapData(t, one(t, objs, "ConfigMap", "-config"))["sandgate.yaml"]
	cfg, err := config.Parse([]byte(doc), t.TempDir())
	require.NoError(t, err, doc)
	o := cfg.Audit.OTLP
	assert.Equal(t, "https://otel-collector.observability:4318", o.Endpoint)
	assert.Equal(t, "grpc", o.Protocol)
	assert.Equal(t, map[string]string{"X-Scope-OrgID": "security"}, o.Headers)
	require.NotNil(t, o.HeaderCredential)
	assert.Equal(t, config.CredentialRef{Name: "audit-otlp-auth", Header: "X-Api-Key", Format: "{value}"}, *o.HeaderCredential)
	var file string
	for _, c := range cfg.Credentials {
		if c.Name == "audit-otlp-auth" {
			file = c.File
		}
	}
	assert.Equal(t, "/etc/sandgate/credentials/audit-otlp-auth/token", file)

	var dep appsv1.Deployment
	typed(t, one(t, objs, "Deployment", ""), &dep)
	var mounted, fromSecret bool
	for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.Name == "audit-otlp-auth" {
			mounted = m.MountPath == "/etc/sandgate/credentials/audit-otlp-auth" && m.ReadOnly
		}
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "audit-otlp-auth" && v.Secret != nil {
			fromSecret = v.Secret.SecretName == "sandgate-otlp" && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "token"
		}
	}
	assert.True(t, mounted, "the auth Secret is mounted read-only where the credential's file is")
	assert.True(t, fromSecret, "the volume is the named Secret's key")
}
