package deploy

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/sandgate/sandgate/internal/config"
)

// policies.bundle points Sandgate at a signed bundle instead of the policies ConfigMap: the
// config names the bundle and the mounted key, the ConfigMap and its volume are gone, and the
// rendered config passes the real binary's --check-config.
func TestChartPointsAtASignedBundleInsteadOfTheConfigMap(t *testing.T) {
	cases := map[string][]string{
		"http bundle service": {"policies.bundle.url=https://bundles.example.com/bundles/sandgate.tar.gz"},
		"oci registry":        {"policies.bundle.oci=ghcr.io/acme/sandgate-policy:prod", "policies.bundle.algorithm=ES256"},
	}
	for name, set := range cases {
		t.Run(name, func(t *testing.T) {
			set = append(set, "policies.bundle.publicKeySecret.name=policy-signing")
			args := append([]string{"template", "sandgate", chartDir, "--namespace", "sandgate"}, valuesArgs(chartCase{}, set...)...)
			out, errOut, err := helm(t, args...)
			require.NoError(t, err, errOut)
			objs := parseObjects(t, out)

			for _, o := range find(objs, "ConfigMap") {
				assert.False(t, strings.HasSuffix(o.GetName(), "-policies"), "no policies ConfigMap with a bundle")
			}
			doc := configMapData(t, one(t, objs, "ConfigMap", "-config"))["sandgate.yaml"]
			cfg, err := config.Parse([]byte(doc), "/etc/sandgate/config")
			require.NoError(t, err, doc)
			assert.Empty(t, cfg.Policy.Dir)
			assert.Equal(t, "/etc/sandgate/bundle-key/public.pem", cfg.Policy.Bundle.PublicKeyFile)

			var d appsv1.Deployment
			typed(t, one(t, objs, "Deployment", "sandgate"), &d)
			pod := d.Spec.Template.Spec
			var keySecret string
			for _, v := range pod.Volumes {
				assert.NotEqual(t, "policies", v.Name)
				if v.Name == "bundle-key" {
					keySecret = v.Secret.SecretName
				}
			}
			assert.Equal(t, "policy-signing", keySecret)
			mounted := false
			for _, vm := range pod.Containers[0].VolumeMounts {
				if vm.Name == "bundle-key" {
					mounted = vm.ReadOnly && strings.HasPrefix(cfg.Policy.Bundle.PublicKeyFile, vm.MountPath+"/")
				}
			}
			assert.True(t, mounted, "the key file the config names is in the read-only Secret mount")

			root := t.TempDir()
			for _, r := range mountRoots {
				doc = strings.ReplaceAll(doc, r, filepath.Join(root, r)+"/")
			}
			conf := filepath.Join(root, "etc", "sandgate", "config", "sandgate.yaml")
			mkdir(t, filepath.Dir(conf))
			writeFile(t, conf, doc)
			key := filepath.Join(root, "etc", "sandgate", "bundle-key", "public.pem")
			mkdir(t, filepath.Dir(key))
			writeFile(t, key, "-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----\n")
			rooted, err := config.Parse([]byte(doc), filepath.Dir(conf))
			require.NoError(t, err, doc)
			writeCredentials(t, objs, rooted)
			mkdir(t, rooted.Audit.File.Dir)
			assert.Contains(t, run(t, sandgateBin(t), "serve", "--check-config", "--config", conf), "is valid")
		})
	}
	t.Run("a bundle without its key Secret is refused", func(t *testing.T) {
		_, errOut, err := helm(t, append([]string{"template", "sandgate", chartDir}, valuesArgs(chartCase{}, "policies.bundle.url=https://b.example.com/b.tar.gz")...)...)
		require.Error(t, err)
		assert.Contains(t, errOut, "policies.bundle.publicKeySecret.name")
	})
}
