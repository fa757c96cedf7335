package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/test/idptest"
)

// tokenLifetime is the access tokens' lifetime at the test IdPs: refresh_before is longer, so
// Sandgate refreshes at half of it, 10 s in, and hands a token out until 5 s before it expires.
const tokenLifetime = 20 * time.Second

// OAuth 2.0 client credentials against Ory Hydra: a token per run minted once for every caller,
// injected on both halves and scrubbed from what echoes it, one refresh for 100 concurrent
// calls, an IdP that is down refusing calls (credential_unavailable, audited) until it is back,
// and the token revoked at Hydra when the run's grant is deleted.
func TestClientCredentialsAtHydra(t *testing.T) {
	hydra := idptest.StartHydra(t, tokenLifetime)
	hydra.CreateClient("sandgate", "hydra-client-secret", []string{"https://inventory.test"}, []string{"inventory.read"})
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret"), []byte("hydra-client-secret"), 0o600))
	m := startMintServe(t, mintConfig{cred: "inventory", credentials: fmt.Sprintf(`  - {name: idp-secret, file: %q}
  - name: inventory
    oauth2_client_credentials: {token_url: %q, revocation_url: %q, client_id: sandgate, client_secret_credential: idp-secret,
      scopes: [inventory.read], audience: [https://inventory.test], refresh_before: 1h}`,
		filepath.Join(dir, "secret"), hydra.Public+"/oauth2/token", hydra.Public+"/oauth2/revoke")})

	t.Run("each run gets its own token from Hydra, minted once, and never reads it", func(t *testing.T) {
		code, body, h := m.get(t, runA, "echo/items")
		require.Equal(t, http.StatusOK, code, body)
		tokA := bearer(t, m.echo.last())
		code, body2, _ := m.get(t, runA, "echo/items")
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, "Bearer "+tokA, m.echo.last(), "the run's token serves its next call")
		code, _, _ = m.get(t, runB, "echo/items")
		require.Equal(t, http.StatusOK, code)
		tokB := bearer(t, m.echo.last())
		assert.NotEqual(t, tokA, tokB, "another run, another token")

		in := hydra.Introspect(tokA)
		assert.True(t, in.Active)
		assert.Equal(t, "sandgate", in.ClientID)
		assert.Equal(t, []string{"https://inventory.test"}, in.Audience)
		assert.Equal(t, "inventory.read", in.Scope)

		assertScrubbed(t, tokA, body, body2, fmt.Sprint(h))
		assert.Contains(t, body, respguard.Marker[:8], "the echo was overwritten in place")
		assert.Empty(t, h.Get("X-Echo"), "the header that echoed it was removed")
		assertScrubbed(t, tokA, m.whoami(t, runA))

		mints := m.waitLifecycle(t, audit.KindCredentialMint, "run-a", 1)
		require.Len(t, mints, 1, "one mint for the run's calls on both halves")
		assert.Equal(t, "inventory", mints[0].Credential)
		require.NotNil(t, mints[0].CredentialToken)
		assert.Equal(t, "oauth2_client_credentials", mints[0].CredentialToken.Provider)
		assert.Equal(t, credential.TokenID(tokA), mints[0].CredentialToken.ID)
		assert.WithinDuration(t, time.Unix(in.Exp, 0), mints[0].CredentialToken.Expires, 2*time.Second)
		calls := m.eventsWhere(t, func(ev audit.Event) bool { return ev.Kind == audit.KindHTTPRequest && ev.Identity.Sandbox == "run-a" })
		require.Len(t, calls, 2)
		for _, ev := range calls {
			assert.Equal(t, "inventory", ev.Credential)
			require.NotNil(t, ev.CredentialToken)
			assert.Equal(t, credential.TokenID(tokA), ev.CredentialToken.ID)
			assert.True(t, ev.Outcome.CredentialEchoed)
		}
		assertNoTokenInLog(t, m.auditDir, tokA, tokB)
	})

	t.Run("one mint for 100 concurrent first calls, one refresh for 100 concurrent calls", func(t *testing.T) {
		oneMintOneRefresh(t, m, runC, "run-c")
		assert.GreaterOrEqual(t, m.metric(t, `sandgate_credential_mints_total{credential="inventory",provider="oauth2_client_credentials",result="ok"`), 4.0)
		assert.Positive(t, m.metric(t, `sandgate_credential_mint_duration_seconds_count{credential="inventory"`))
	})

	t.Run("Hydra down refuses a new run's calls, audited, until it is back", func(t *testing.T) {
		hydra.Stop()
		idpDown(t, m, runD, "run-d", `credential "inventory" (oauth2_client_credentials) is unavailable: token endpoint unreachable`)
		code, _, _ := m.get(t, runA, "echo/items")
		assert.Equal(t, http.StatusOK, code, "a run holding a live token is not affected")
		hydra.Start()
		recovers(t, m, runD)
	})

	t.Run("deleting the run's grant revokes its token at Hydra", func(t *testing.T) {
		code, _, _ := m.get(t, runB, "echo/items")
		require.Equal(t, http.StatusOK, code)
		tokB := bearer(t, m.echo.last())
		m.grant(t, "agents/run-b", "task", map[string]any{"ticket": 7})
		m.grant(t, "agents/run-b", "task", nil)
		revoke := m.waitRevoke(t, "run-b", tokB)
		assert.Contains(t, revoke.Decision.Reason, `its grant "task" was deleted`)
		assert.Empty(t, revoke.Outcome.Error, "Hydra confirmed the revocation")
		assert.False(t, hydra.Introspect(tokB).Active, "Hydra no longer accepts the token")
		code, _, _ = m.get(t, runB, "echo/items")
		require.Equal(t, http.StatusOK, code)
		assert.NotEqual(t, tokB, bearer(t, m.echo.last()), "the run's next call gets a new token")
	})

	t.Run("with every run's token live, each run's echo on the MCP half is scrubbed", func(t *testing.T) {
		// The MCP half scrubs with the set of every live run's token: the five runs' tokens, and
		// those replaced or revoked before (kept until they expire, past this test's end), make
		// it a wide set (respguard/wide.go).
		var toks []string
		for _, src := range []string{runA, runB, runC, runD, runE} {
			code, _, _ := m.get(t, src, "echo/items")
			require.Equal(t, http.StatusOK, code)
			toks = append(toks, bearer(t, m.echo.last()))
		}
		forms := len(respguard.Forms("admin-token-of-the-mint-tests")) + len(respguard.Forms("hydra-client-secret"))
		seen := map[string]bool{}
		for _, auth := range m.echo.seen() {
			if tok := bearer(t, auth); !seen[tok] {
				seen[tok] = true
				forms += len(respguard.Forms(tok))
			}
		}
		require.GreaterOrEqual(t, forms, 48, "enough forms for a wide set")
		for i, src := range []string{runA, runB, runC, runD, runE} {
			body := m.whoami(t, src)
			assertScrubbed(t, toks[i], body)
			assert.Contains(t, body, respguard.Marker[:8], "the echo was overwritten in place")
		}
	})
}

// oneMintOneRefresh: 100 concurrent first calls of a run share one mint; once the token is past
// its refresh time, 100 concurrent calls go on with it while one refresh runs; the next call has
// the new token.
func oneMintOneRefresh(t *testing.T, m *mintServe, src, sandbox string) {
	t.Helper()
	for _, code := range m.concurrently(t, 100, src, "echo/x") {
		require.Equal(t, http.StatusOK, code)
	}
	mints := m.waitLifecycle(t, audit.KindCredentialMint, sandbox, 1)
	require.Len(t, mints, 1, "one mint for 100 concurrent calls")
	first := mints[0]
	tok := bearer(t, m.echo.last())
	// The refresh time is half the token's life (refresh_before is longer): wait for it on the
	// clock, since that is what it is about.
	half := first.Time.Add(first.CredentialToken.Expires.Sub(first.Time) / 2)
	require.Eventually(t, func() bool { return time.Now().After(half.Add(200 * time.Millisecond)) }, time.Minute, 50*time.Millisecond)
	before := len(m.echo.seen())
	for _, code := range m.concurrently(t, 100, src, "echo/x") {
		require.Equal(t, http.StatusOK, code)
	}
	refreshes := m.waitLifecycle(t, audit.KindCredentialRefresh, sandbox, 1)
	require.Len(t, refreshes, 1, "one refresh for 100 concurrent calls")
	assert.Len(t, m.lifecycle(t, audit.KindCredentialMint, sandbox), 1)
	// The call that found the token past its refresh time went on with it, as did every call
	// until the refresh was done; the later ones had the refreshed token, and no other.
	round := m.echo.seen()[before:]
	assert.Contains(t, round, "Bearer "+tok, "callers go on with the current token during the refresh")
	for _, a := range round {
		id := credential.TokenID(bearer(t, a))
		assert.True(t, a == "Bearer "+tok || id == refreshes[0].CredentialToken.ID, "a call had a token of neither mint")
	}
	code, _, _ := m.get(t, src, "echo/x")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, refreshes[0].CredentialToken.ID, credential.TokenID(bearer(t, m.echo.last())), "the next call has the refreshed token")
}

// idpDown: a run without a token is refused 503 credential_unavailable with the provider's
// reason and Retry-After, and both its call and the failed mint are audited.
func idpDown(t *testing.T, m *mintServe, src, sandbox, reason string) {
	t.Helper()
	code, body, h := m.get(t, src, "echo/items")
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	var refusal struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(body), &refusal), body)
	assert.Equal(t, "credential_unavailable", refusal.Error.Code)
	assert.Contains(t, refusal.Error.Message, reason)
	assert.NotEmpty(t, h.Get("Retry-After"))
	var calls []audit.Event
	require.Eventually(t, func() bool {
		calls = m.eventsWhere(t, func(ev audit.Event) bool { return ev.Kind == audit.KindHTTPRequest && ev.Identity.Sandbox == sandbox })
		return len(calls) == 1
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "credential_unavailable", calls[0].Outcome.Error)
	assert.Equal(t, http.StatusServiceUnavailable, calls[0].Outcome.Status)
	assert.Contains(t, calls[0].Decision.Reason, reason)
	failed := m.waitLifecycle(t, audit.KindCredentialMint, sandbox, 1)
	assert.Equal(t, "credential_unavailable", failed[0].Outcome.Error)
	assert.Nil(t, failed[0].CredentialToken)
}

// recovers: once the IdP is back, the run's calls get a token (after the backoff).
func recovers(t *testing.T, m *mintServe, src string) {
	t.Helper()
	require.Eventually(t, func() bool {
		code, _, _ := m.get(t, src, "echo/items")
		return code == http.StatusOK
	}, 40*time.Second, 200*time.Millisecond, "calls succeed again once the IdP is back")
}

// assertNoTokenInLog checks that the audit log holds no minted token, in any form.
func assertNoTokenInLog(t *testing.T, dir string, tokens ...string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, audit.ActiveFile))
	require.NoError(t, err)
	for _, tok := range tokens {
		assert.False(t, strings.Contains(string(b), tok), "a minted token is in the audit log")
	}
}
