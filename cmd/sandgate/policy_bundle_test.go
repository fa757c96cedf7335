package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// opaBuild builds a bundle of the shipped policies with the real `opa build`, signed with the
// private key at keyFile when it is not "", as docs/policies.md tells a security team to.
func opaBuild(t *testing.T, out, revision, keyFile string) {
	t.Helper()
	opa := repoPath(t, ".tools/bin/opa")
	if _, err := os.Stat(opa); err != nil {
		t.Fatalf("%s is missing: run test/setup.sh", opa)
	}
	args := []string{"build", "-b", repoPath(t, "policies"), "-o", out, "--revision", revision}
	if keyFile != "" {
		args = append(args, "--signing-key", keyFile, "--signing-alg", "ES256")
	}
	cmd := exec.Command(opa, args...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
}

func writeSigningKeys(t *testing.T, dir string) (private, public string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalECPrivateKey(k)
	require.NoError(t, err)
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	require.NoError(t, err)
	return writeFile(t, dir, "private.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))),
		writeFile(t, dir, "public.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
}

func TestCheckConfigLoadsAndVerifiesAFileBundle(t *testing.T) {
	dir := t.TempDir()
	private, public := writeSigningKeys(t, dir)
	signed, unsigned := filepath.Join(dir, "signed.tar.gz"), filepath.Join(dir, "unsigned.tar.gz")
	opaBuild(t, signed, "r1", private)
	opaBuild(t, unsigned, "r1", "")
	bundleCfg := func(file string) string {
		return "policy:\n  bundle:\n    file: " + file + "\n    public_key_file: " + public + "\n    algorithm: ES256\n"
	}
	cases := []struct {
		name, config string
		wantCode     int
		wantOut      string
	}{
		{"a bundle signed by the configured key is valid", bundleCfg(signed), 0, "is valid"},
		{"an unsigned bundle is refused", bundleCfg(unsigned), 1, "policy.bundle: " + unsigned + ": bundle missing .signatures.json file"},
		{"policy.dir and policy.bundle together name the field", "policy:\n  dir: " + repoPath(t, "policies") + "\n" +
			bundleCfg(signed)[len("policy:\n"):], 1, "policy.bundle: policy.dir and policy.bundle are mutually exclusive"},
		{"a missing key file names the field", "policy:\n  bundle:\n    file: " + signed + "\n    public_key_file: /nonexistent/k.pem\n", 1,
			"policy.bundle.public_key_file: /nonexistent/k.pem: no such file or directory"},
		{"a shadow folder without policy is refused", bundleCfg(signed) + "  shadow:\n    dir: " + dir + "\n", 1, "policy.shadow.dir: "},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeFile(t, dir, "c"+string(rune('a'+i))+".yaml", tc.config)
			code, out, errOut := runCLI(t, nil, "serve", "--check-config", "--config", cfg)
			assert.Equal(t, tc.wantCode, code, "stderr: %s", errOut)
			assert.Contains(t, out+errOut, tc.wantOut)
		})
	}
}

func TestPolicyCommandsNeedAFolderWhenTheConfigServesABundle(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "sandgate.yaml", "policy:\n  bundle:\n    url: https://b.example.com/b.tar.gz\n    public_key_file: k.pem\n  decision_log:\n    file: d.log\n")
	code, _, errOut := runCLI(t, nil, "policy", "replay", "--config", cfg)
	assert.Equal(t, 1, code, errOut)
	assert.Contains(t, errOut, "serves a bundle (policy.bundle), not a folder")
}
