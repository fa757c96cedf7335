package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

const idpSecret = "credentials:\n  - name: secret\n    env: S\n"

func TestMintedCredentialErrorsNameTheField(t *testing.T) {
	cases := []struct{ name, doc, wantErr string }{
		{"two providers", idpSecret + "  - name: m\n    oauth2_client_credentials: {token_url: http://idp/t, client_id: c, client_secret_credential: secret}\n    github_app: {app_id: 1}\n",
			"credentials[1]: set one provider of oauth2_client_credentials, token_exchange, github_app"},
		{"a provider and a file", idpSecret + "  - name: m\n    file: /x\n    oauth2_client_credentials: {token_url: http://idp/t, client_id: c, client_secret_credential: secret}\n",
			"credentials[1]: a minted credential (oauth2_client_credentials) has no file or env"},
		{"token endpoint that is no URL", idpSecret + "  - name: m\n    oauth2_client_credentials: {token_url: idp, client_id: c, client_secret_credential: secret}\n",
			`credentials[1].oauth2_client_credentials.token_url: "idp" is not an http(s) URL`},
		{"client secret minted itself", "credentials:\n  - name: m\n    oauth2_client_credentials: {token_url: http://idp/t, client_id: c, client_secret_credential: m}\n",
			`credentials[0].oauth2_client_credentials.client_secret_credential: credential "m" is minted per sandbox run`},
		{"token exchange without run tokens", idpSecret + "  - name: m\n    token_exchange: {token_url: http://idp/t, client_id: c, client_secret_credential: secret}\n",
			"credentials[1].token_exchange: needs run_tokens"},
		{"github app without permissions", idpSecret + "  - name: gh\n    github_app: {app_id: 1, installation_id: 2, owner: acme, private_key_credential: secret}\n",
			"credentials[1].github_app.permissions: name at least one permission"},
		{"github app permission level", idpSecret + "  - name: gh\n    github_app: {app_id: 1, installation_id: 2, owner: acme, private_key_credential: secret, permissions: {contents: all}}\n",
			`credentials[1].github_app.permissions.contents: "all" is not one of read, write, admin`},
		{"admin token that is minted", idpSecret + "  - name: m\n    oauth2_client_credentials: {token_url: http://idp/t, client_id: c, client_secret_credential: secret}\nadmin:\n  token_credential: m\n",
			`admin.token_credential: credential "m" is minted per sandbox run`},
		{"run tokens without a key", "run_tokens: {issuer: http://sandgate}\n", "run_tokens.key_credential: must name a credential"},
		{"run token lifetime too long", idpSecret + "run_tokens: {issuer: http://sandgate, key_credential: secret, lifetime: 2h}\n", "run_tokens.lifetime: must be between 10s and 1h"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestMintedCredentialDefaults(t *testing.T) {
	c, err := config.Parse([]byte(idpSecret+"  - name: gh\n    github_app: {app_id: 1, installation_id: 2, owner: acme, private_key_credential: secret, permissions: {contents: read}}\n"+
		"  - name: te\n    token_exchange: {token_url: 'http://127.0.0.1:9998/oauth/token', client_id: c, client_secret_credential: secret}\n"+
		"run_tokens: {issuer: http://sandgate, key_credential: secret}\n"), "/etc/sandgate")
	require.NoError(t, err)
	gh := c.Credentials[1]
	assert.True(t, gh.Minted())
	assert.Equal(t, config.ProviderGitHubApp, gh.Provider())
	assert.Equal(t, "https://api.github.com", gh.GitHubApp.APIURL)
	assert.Equal(t, "github_repos", gh.GitHubApp.RepositoriesGrant)
	assert.Equal(t, time.Minute, gh.GitHubApp.RefreshBefore.D())
	te := c.Credentials[2].TokenExchange
	assert.Equal(t, "http://127.0.0.1:9998", te.SubjectAudience)
	assert.Equal(t, config.TokenTypeAccessToken, te.RequestedTokenType)
	assert.Equal(t, "client_secret_basic", te.AuthMethod)
	assert.Equal(t, 5*time.Minute, c.RunTokens.Lifetime.D())
	assert.False(t, c.Credentials[0].Minted())
}
