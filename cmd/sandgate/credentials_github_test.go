package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/test/githubapi"
)

// githubServe is Sandgate with a github_app credential "github" at the stand-in gh: the route
// "github" to the stand-in and the echo route and upstream inject it.
func githubServe(t *testing.T, gh *githubapi.Server, key []byte) *mintServe {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app-key"), key, 0o600))
	return startMintServe(t, mintConfig{cred: "github", credentials: fmt.Sprintf(`  - {name: github-app-key, file: %q}
  - name: github
    github_app: {api_url: %q, app_id: %d, installation_id: %d, owner: acme, private_key_credential: github-app-key,
      permissions: {contents: read, metadata: read}, refresh_before: 1h}`, filepath.Join(dir, "app-key"), gh.URL, gh.AppID, gh.InstallationID),
		routes: []string{fmt.Sprintf("{name: github, upstream: %q, allow_private: true, credential: {name: github}}", gh.URL)}})
}

// tokenOf is the stand-in's token whose value the run's call carried.
func tokenOf(t *testing.T, gh *githubapi.Server, value string) githubapi.Token {
	t.Helper()
	for _, tk := range gh.Tokens() {
		if tk.Value == value {
			return tk
		}
	}
	t.Fatalf("the stand-in minted no such token")
	return githubapi.Token{}
}

// GitHub App installation tokens at the GitHub stand-in: a token per run restricted to the
// repositories its grant names (policy refuses the others first, and GitHub would too), none for
// a run without a granted repository, scrubbed from what echoes it, one mint and one refresh for
// 100 concurrent calls, GitHub down and back, and revoked at GitHub when the grant is deleted.
// Every answer the stand-in gave follows GitHub's description.
func TestGitHubAppTokensAtTheStandIn(t *testing.T) {
	key, keyPEM := githubapi.GenerateAppKey(t)
	gh := githubapi.Start(t, &key.PublicKey, "acme", "widgets", "other")
	gh.Lifetime = tokenLifetime
	m := githubServe(t, gh, keyPEM)
	for _, run := range []string{"run-a", "run-c", "run-d", "run-e"} {
		m.grant(t, "agents/"+run, "github_repos", []string{"acme/widgets", "elsewhere/thing"})
	}

	t.Run("a run's token reaches its granted repositories only, and policy refuses the others first", func(t *testing.T) {
		code, body, _ := m.get(t, runA, "github/repos/acme/widgets/git/ref/heads/main")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"ref":"refs/heads/main"`)
		tk := tokenOf(t, gh, bearer(t, m.lastAuthAt(t, gh)))
		assert.Equal(t, []string{"acme/widgets"}, tk.Repositories, "only the granted repositories of the installation's owner")
		assert.Equal(t, map[string]string{"contents": "read", "metadata": "read"}, tk.Permissions)

		code, body, _ = m.get(t, runA, "github/repos/acme/other/git/ref/heads/main")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Contains(t, body, "acme/other is outside what the run's token reaches")
		for _, a := range gh.Answers() {
			assert.NotContains(t, a.URL, "/repos/acme/other", "the refused call never reached GitHub")
		}
		// And GitHub would have refused it: the token does not reach acme/other.
		req, _ := http.NewRequest(http.MethodGet, gh.URL+"/repos/acme/other/git/ref/heads/main", nil)
		req.Header.Set("Authorization", "Bearer "+tk.Value)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	})

	t.Run("a run without a granted repository gets no token, never one for every repository", func(t *testing.T) {
		before := len(gh.Tokens())
		code, body, _ := m.get(t, runB, "github/repos/acme/widgets/git/ref/heads/main")
		assert.Equal(t, http.StatusForbidden, code, "policy sees the run's token would reach nothing")
		assert.Contains(t, body, "outside_token")
		code, body, _ = m.get(t, runB, "echo/x")
		assert.Equal(t, http.StatusServiceUnavailable, code, "a call policy allows gets no token either")
		assert.Contains(t, body, "no repository of acme is granted to this run (grant github_repos)")
		assert.Len(t, gh.Tokens(), before)
	})

	t.Run("a token an upstream echoes is scrubbed on both halves", func(t *testing.T) {
		code, body, h := m.get(t, runA, "echo/x")
		require.Equal(t, http.StatusOK, code)
		tok := bearer(t, m.echo.last())
		assert.True(t, strings.HasPrefix(tok, "ghs_"))
		assertScrubbed(t, tok, body, fmt.Sprint(h), m.whoami(t, runA))
	})

	t.Run("one mint for 100 concurrent first calls, one refresh for 100 concurrent calls", func(t *testing.T) {
		oneMintOneRefresh(t, m, runC, "run-c")
	})

	t.Run("GitHub down refuses a new run's calls, audited, until it is back", func(t *testing.T) {
		gh.Stop()
		idpDown(t, m, runD, "run-d", `credential "github" (github_app) is unavailable: GitHub API unreachable`)
		gh.Start(t)
		recovers(t, m, runD)
	})

	t.Run("deleting the run's grant revokes its token at GitHub; a new grant gets a new token", func(t *testing.T) {
		code, _, _ := m.get(t, runE, "echo/x")
		require.Equal(t, http.StatusOK, code)
		tok := bearer(t, m.echo.last())
		m.grant(t, "agents/run-e", "github_repos", nil)
		select {
		case revoked := <-gh.Revoked():
			assert.Equal(t, tok, revoked)
		case <-time.After(10 * time.Second):
			t.Fatal("GitHub saw no revocation")
		}
		m.waitRevoke(t, "run-e", tok)
		m.grant(t, "agents/run-e", "github_repos", []string{"acme/widgets"})
		code, _, _ = m.get(t, runE, "echo/x")
		require.Equal(t, http.StatusOK, code)
		assert.NotEqual(t, tok, bearer(t, m.echo.last()))
	})

	githubapi.CheckAnswers(t, gh.Answers())
}

// lastAuthAt is the token of the last git/ref call the stand-in answered: the stand-in keeps
// what it minted; the call's token is the one minted last that reaches the repository.
func (m *mintServe) lastAuthAt(t *testing.T, gh *githubapi.Server) string {
	t.Helper()
	toks := gh.Tokens()
	slices.SortFunc(toks, func(a, b githubapi.Token) int { return a.Expires.Compare(b.Expires) })
	require.NotEmpty(t, toks)
	return "Bearer " + toks[len(toks)-1].Value
}
