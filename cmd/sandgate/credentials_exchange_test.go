package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/test/idptest"
)

// runKeyPEM is a new run-token signing key (EC P-256, PKCS #8).
func runKeyPEM(t *testing.T) []byte {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(k)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// exchangeServe is Sandgate with a token_exchange credential "ledger" at op, and a second
// one, "ledger-elsewhere", at an OP that reads another key set than Sandgate's.
func exchangeServe(t *testing.T, admin string, op, elsewhere *idptest.OIDCOP) *mintServe {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run-key"), runKeyPEM(t), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret"), []byte(op.Secret), 0o600))
	te := func(name string, o *idptest.OIDCOP) string {
		return fmt.Sprintf(`  - name: %s
    token_exchange: {token_url: %q, revocation_url: %q, client_id: %s, client_secret_credential: te-secret,
      scopes: [ledger.read], audience: [https://ledger.test], refresh_before: 1h}
`, name, o.TokenURL(), o.RevocationURL(), o.ClientID)
	}
	return startMintServe(t, mintConfig{admin: admin, cred: "ledger",
		credentials: fmt.Sprintf("  - {name: run-key, file: %q}\n  - {name: te-secret, file: %q}\n", filepath.Join(dir, "run-key"), filepath.Join(dir, "secret")) +
			te("ledger", op) + te("ledger-elsewhere", elsewhere),
		extra:  "run_tokens: {issuer: https://sandgate.test, key_credential: run-key}",
		routes: []string{"{name: elsewhere, upstream: http://127.0.0.1:9, allow_private: true, credential: {name: ledger-elsewhere}}"}})
}

// RFC 8693 token exchange at zitadel/oidc's example OP: the subject token is a JWT Sandgate
// signs for the run, which the OP verifies against Sandgate's JWKS (the admin listener's) and
// exchanges for an access token of that run; a run token the OP cannot verify under the key
// set it reads gets nothing. Then the same lifetime as every minted credential: one mint and one
// refresh for 100 concurrent calls, the OP down and back, revocation when the grant is deleted.
func TestTokenExchangeAtTheExampleOP(t *testing.T) {
	admin := freeAddr(t)
	op := idptest.StartOIDCOP(t, "http://"+admin+"/.well-known/jwks.json", "https://sandgate.test", tokenLifetime)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		tokens, err := credential.NewRunTokens(runKeyPEM(t), "https://sandgate.test", time.Minute, nil)
		require.NoError(t, err)
		_, _ = w.Write(tokens.JWKS())
	}))
	t.Cleanup(other.Close)
	elsewhere := idptest.StartOIDCOP(t, other.URL, "https://sandgate.test", tokenLifetime)
	elsewhere.Secret = op.Secret
	m := exchangeServe(t, admin, op, elsewhere)

	t.Run("Sandgate publishes the run tokens' key set on the admin listener", func(t *testing.T) {
		resp, err := http.Get("http://" + admin + "/.well-known/jwks.json")
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, "application/jwk-set+json", resp.Header.Get("Content-Type"))
		var set struct{ Keys []map[string]string }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&set))
		require.Len(t, set.Keys, 1)
		assert.Equal(t, "ES256", set.Keys[0]["alg"])
		assert.NotEmpty(t, set.Keys[0]["kid"])
		assert.Empty(t, set.Keys[0]["d"], "no private part")
	})

	t.Run("each run's token is exchanged for its own run token, and never read by it", func(t *testing.T) {
		code, body, h := m.get(t, runA, "echo/entries")
		require.Equal(t, http.StatusOK, code, body)
		tokA := bearer(t, m.echo.last())
		code, _, _ = m.get(t, runB, "echo/entries")
		require.Equal(t, http.StatusOK, code)
		assert.NotEqual(t, tokA, bearer(t, m.echo.last()))
		assertScrubbed(t, tokA, body, fmt.Sprint(h), m.whoami(t, runA))
		mints := m.waitLifecycle(t, audit.KindCredentialMint, "run-a", 1)
		require.Len(t, mints, 1)
		assert.Equal(t, "token_exchange", mints[0].CredentialToken.Provider)
		assert.Equal(t, credential.TokenID(tokA), mints[0].CredentialToken.ID)
		assert.WithinDuration(t, time.Now().Add(tokenLifetime), mints[0].CredentialToken.Expires, 15*time.Second)
	})

	t.Run("an IdP that reads another key set refuses the run token", func(t *testing.T) {
		code, body, _ := m.get(t, runA, "elsewhere/entries")
		assert.Equal(t, http.StatusServiceUnavailable, code, body)
		assert.Contains(t, body, "token endpoint answered HTTP 400 (invalid_request)")
	})

	t.Run("one mint for 100 concurrent first calls, one refresh for 100 concurrent calls", func(t *testing.T) {
		oneMintOneRefresh(t, m, runC, "run-c")
	})

	t.Run("the OP down refuses a new run's calls, audited, until it is back", func(t *testing.T) {
		op.Stop()
		idpDown(t, m, runD, "run-d", `credential "ledger" (token_exchange) is unavailable: token endpoint unreachable`)
		op.Start()
		recovers(t, m, runD)
	})

	t.Run("deleting the run's grant revokes its token at the OP", func(t *testing.T) {
		code, _, _ := m.get(t, runE, "echo/entries")
		require.Equal(t, http.StatusOK, code)
		tok := bearer(t, m.echo.last())
		m.grant(t, "agents/run-e", "task", map[string]any{"ticket": 9})
		m.grant(t, "agents/run-e", "task", nil)
		revoke := m.waitRevoke(t, "run-e", tok)
		assert.Empty(t, revoke.Outcome.Error, "the OP confirmed the revocation")
	})
}
