package proxy

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCA(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, err := InitCA(dir, false, time.Now())
	require.NoError(t, err)

	t.Run("key file is written with mode 0600", func(t *testing.T) {
		st, err := os.Stat(keyPath)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	})
	t.Run("existing CA is not overwritten without force", func(t *testing.T) {
		_, _, err := InitCA(dir, false, time.Now())
		require.ErrorContains(t, err, "--force")
		_, _, err = InitCA(dir, true, time.Now())
		require.NoError(t, err)
	})
	ca, err := LoadCA(certPath, keyPath)
	require.NoError(t, err)
	t.Run("leaf verifies against the CA for its host", func(t *testing.T) {
		leaf, err := ca.Leaf("api.anthropic.com")
		require.NoError(t, err)
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(ca.CertPEM()))
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.anthropic.com", Roots: pool})
		require.NoError(t, err)
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "evil.example", Roots: pool})
		require.Error(t, err)
	})
	t.Run("leaf certificates are cached", func(t *testing.T) {
		a, err := ca.Leaf("api.openai.com")
		require.NoError(t, err)
		b, err := ca.Leaf("api.openai.com")
		require.NoError(t, err)
		assert.Same(t, a, b)
	})
	t.Run("key readable by others is refused", func(t *testing.T) {
		require.NoError(t, os.Chmod(keyPath, 0o644))
		_, err := LoadCA(certPath, keyPath)
		require.ErrorContains(t, err, "chmod 600")
		require.NoError(t, os.Chmod(keyPath, 0o600))
	})
	_ = filepath.Join
}
