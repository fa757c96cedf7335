package deploy

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/test/kubetest"
)

// auditKeys are the files of the audit keys Secret the chart renders (none with
// audit.tamperEvidence off or an existingSecret: then `sandgate audit keygen` makes them, as
// the operator would), by file name.
func auditKeys(t testing.TB, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	for _, o := range find(objs, "Secret") {
		if !strings.HasSuffix(o.GetName(), "-audit-keys") {
			continue
		}
		var s corev1.Secret
		typed(t, o, &s)
		out := map[string]string{}
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out
	}
	dir := t.TempDir()
	run(t, sandgateBin(t), "audit", "keygen", "--dir", dir)
	out := map[string]string{}
	for _, f := range []string{audit.ChainKeyFile, audit.SigningKeyFile} {
		out[f] = readFile(t, dir+"/"+f)
	}
	return out
}

// checkAuditKeysSecret checks the one Secret the chart renders, when it renders one: the audit
// log's keys, in the form `sandgate audit keygen` writes them, kept on uninstall, and mounted
// where the config reads them. Credentials of the user come from the user's own Secrets.
func checkAuditKeysSecret(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	m := materialize(t, objs)
	var secrets []*unstructured.Unstructured
	for _, s := range find(objs, "Secret") {
		if rt := m.cfg.RunTokens; rt != nil && rt.JWKSSecret != nil && s.GetName() == rt.JWKSSecret.Name {
			assert.Empty(t, s.Object["data"], "the run tokens' JWKS Secret is created empty: Sandgate writes the public keys")
			continue
		}
		secrets = append(secrets, s)
	}
	if m.cfg.Audit.ChainKeyCredential == "" {
		assert.Empty(t, secrets, "no Secret without tamper evidence")
		return
	}
	assert.NotEmpty(t, m.cfg.Audit.Checkpoint.SigningKeyCredential, "the chain is keyed and checkpoints are signed")
	if len(secrets) == 0 {
		return // audit.tamperEvidence.existingSecret
	}
	require.Len(t, secrets, 1, "the only Secret the chart renders holds the audit keys")
	s := secrets[0]
	assert.Equal(t, "keep", s.GetAnnotations()["helm.sh/resource-policy"], "an uninstall keeps the keys the log was written with")
	keys := auditKeys(t, objs)
	assert.Len(t, keys, 2)
	chain := strings.TrimRight(keys[audit.ChainKeyFile], "\n")
	raw, err := base64.StdEncoding.DecodeString(chain)
	require.NoError(t, err, "chain.key is base64, as keygen writes it")
	assert.Len(t, raw, 32)
	_, err = audit.ParseSigningKey([]byte(keys[audit.SigningKeyFile]))
	assert.NoError(t, err, "checkpoint.key is an Ed25519 PKCS#8 key")
}

// The chart makes the audit keys Secret on install; an upgrade keeps its keys (lookup), and an
// uninstall leaves it, so a reinstall takes the same keys up again: a log keyed and signed
// before verifies after. Helm installs into a real kube-apiserver.
func TestChartAuditKeysSurviveUpgradeAndUninstall(t *testing.T) {
	helmBin(t)
	cluster := kubetest.Start(t)
	cs, _ := kubetest.Clients(t, cluster.Admin)
	kubeconfig := kubetest.WriteKubeconfig(t, cluster.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	release, ns := "sandgate", "sg-keys"
	for _, o := range render(t, chartCase{name: "default"}, release, ns) {
		ensureNamespace(t, ctx, cs, o.GetNamespace())
	}
	helmOn := func(args ...string) {
		t.Helper()
		out, errOut, err := helm(t, append(args, "--namespace", ns, "--kubeconfig", kubeconfig)...)
		require.NoError(t, err, "helm %s\n%s%s", strings.Join(args, " "), out, errOut)
	}
	keys := func() map[string][]byte {
		t.Helper()
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, release+"-audit-keys", metav1.GetOptions{})
		require.NoError(t, err)
		return s.Data
	}

	helmOn("install", release, chartDir)
	installed := keys()
	require.Len(t, installed, 2)
	_, err := audit.ParseSigningKey(installed[audit.SigningKeyFile])
	require.NoError(t, err)
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, release, metav1.GetOptions{})
	require.NoError(t, err)
	mounted := false
	for _, v := range d.Spec.Template.Spec.Volumes {
		mounted = mounted || v.Secret != nil && v.Secret.SecretName == release+"-audit-keys"
	}
	assert.True(t, mounted, "the pod mounts the audit keys Secret")

	helmOn("upgrade", release, chartDir, "--set", "replicaCount=3")
	assert.Equal(t, installed, keys(), "an upgrade keeps the keys")

	helmOn("uninstall", release)
	assert.Equal(t, installed, keys(), "an uninstall leaves the keys")
	helmOn("install", release, chartDir)
	assert.Equal(t, installed, keys(), "a reinstall takes the kept keys up again")
}
