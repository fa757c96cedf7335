package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/test/githubapi"
	"github.com/sandgate/sandgate/test/kubetest"
)

// The pod addresses the test gives the warm pool's two sandboxes.
var poolAddrs = []string{"127.0.36.1", "127.0.36.2"}

// A run's credential on the real kube-apiserver with the Agent Sandbox controller: a claim
// granted acme/widgets calls through its sandbox with a GitHub token minted for that claim only;
// the token cannot reach acme/other (policy refuses first, and GitHub would); deleting the claim
// revokes the token within seconds (GitHub sees it); a new claim gets a new token.
func TestAClaimsTokenLivesAsLongAsTheClaim(t *testing.T) {
	cluster := kubetest.Start(t)
	cluster.StartController(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	ctx := context.Background()
	const ns = "sandboxes"
	kubetest.Namespace(t, cs, ns, nil)
	kubetest.Template(t, dyn, ns, "coding-agent", "")
	kubetest.WarmPool(t, dyn, ns, "wp", "coding-agent", 2)
	var workers []string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		require.NoError(ct, err)
		workers = workers[:0]
		for _, p := range pods.Items {
			workers = append(workers, p.Name)
		}
		assert.Len(ct, workers, 2)
	}, 90*time.Second, 100*time.Millisecond, "the warm pool's pods")
	for i, w := range workers {
		kubetest.SetPodIPs(t, cs, ns, w, poolAddrs[i])
	}

	key, keyPEM := githubapi.GenerateAppKey(t)
	gh := githubapi.Start(t, &key.PublicKey, "acme", "widgets", "other")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app-key"), keyPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run-key"), runKeyPEM(t), 0o600))
	m := startMintServe(t, mintConfig{cred: "github", credentials: fmt.Sprintf(`  - {name: github-app-key, file: %q}
  - {name: run-key, file: %q}
  - name: github
    github_app: {api_url: %q, app_id: %d, installation_id: %d, owner: acme, private_key_credential: github-app-key,
      permissions: {contents: read}}`, filepath.Join(dir, "app-key"), filepath.Join(dir, "run-key"), gh.URL, gh.AppID, gh.InstallationID),
		extra:    "run_tokens: {issuer: https://sandgate.test, key_credential: run-key, jwks_secret: {namespace: default, name: sandgate-run-token-keys}}",
		routes:   []string{fmt.Sprintf("{name: github, upstream: %q, allow_private: true, credential: {name: github}}", gh.URL)},
		identity: fmt.Sprintf("kubernetes: {enabled: true, kubeconfig: %q, namespaces: [%s]}", kubetest.WriteKubeconfig(t, cluster.Admin), ns)})

	t.Run("the run tokens' keys are published in the Secret, as on the admin listener", func(t *testing.T) {
		resp, err := http.Get("http://" + m.admin + "/.well-known/jwks.json")
		require.NoError(t, err)
		served, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			s, err := cs.CoreV1().Secrets("default").Get(ctx, "sandgate-run-token-keys", metav1.GetOptions{})
			require.NoError(ct, err)
			assert.JSONEq(ct, string(served), string(s.Data["jwks.json"]))
		}, 30*time.Second, 100*time.Millisecond)
	})

	claim := func(name string) string { // the claim's sandbox address, once it has one
		kubetest.Claim(t, dyn, ns, name, "wp")
		m.grant(t, ns+"/claims/"+name, "github_repos", []string{"acme/widgets"})
		return claimAddr(t, dyn, ns, name)
	}
	first := claim("task-1")
	tok := claimCalls(t, m, gh, first, "task-1")

	require.NoError(t, dyn.Resource(kubetest.SandboxClaimGVR).Namespace(ns).Delete(ctx, "task-1", metav1.DeleteOptions{}))
	select {
	case revoked := <-gh.Revoked():
		assert.Equal(t, tok, revoked, "GitHub saw the claim's token revoked")
	case <-time.After(10 * time.Second):
		t.Fatal("deleting the claim did not revoke its token within 10 s")
	}
	revoke := m.waitRevoke(t, "", tok)
	assert.Equal(t, "task-1", revoke.Identity.Claim)
	assert.Contains(t, revoke.Decision.Reason, "its claim was deleted")

	second := claim("task-2")
	tok2 := claimCalls(t, m, gh, second, "task-2")
	assert.NotEqual(t, tok, tok2, "a new claim gets a new token")
	githubapi.CheckAnswers(t, gh.Answers())
}

// claimAddr waits for the claim to be bound to a sandbox with an address and returns it.
func claimAddr(t *testing.T, dyn dynamic.Interface, ns, name string) string {
	var addr string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := dyn.Resource(kubetest.SandboxClaimGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(ct, err)
		ips, _, _ := unstructured.NestedStringSlice(got.Object, "status", "sandbox", "podIPs")
		if assert.Len(ct, ips, 1, "the claim names its sandbox's address") {
			addr = ips[0]
		}
	}, 90*time.Second, 100*time.Millisecond)
	return addr
}

// claimCalls makes the claim's calls from its sandbox at src: acme/widgets with a token minted
// for the claim and restricted to it; acme/other refused by policy before GitHub, which would
// refuse the token too. It returns the token.
func claimCalls(t *testing.T, m *mintServe, gh *githubapi.Server, src, claim string) string {
	t.Helper()
	var code int
	var body string
	require.Eventually(t, func() bool { // until Sandgate's identity cache has the claim's sandbox
		code, body, _ = m.get(t, src, "github/repos/acme/widgets/git/ref/heads/main")
		return code != http.StatusForbidden || !strings.Contains(body, "unknown_caller")
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, http.StatusOK, code, body)
	mints := m.eventsWhere(t, func(ev audit.Event) bool { return ev.Kind == audit.KindCredentialMint && ev.Identity.Claim == claim })
	require.Len(t, mints, 1, "one token for the claim")
	assert.True(t, mints[0].Identity.Known)
	var tok string
	for _, tk := range gh.Tokens() {
		if credential.TokenID(tk.Value) == mints[0].CredentialToken.ID {
			tok = tk.Value
			assert.Equal(t, []string{"acme/widgets"}, tk.Repositories, "minted for the claim's grant only")
		}
	}
	require.NotEmpty(t, tok, "GitHub minted the claim's token")

	seen := len(gh.Answers())
	code, body, _ = m.get(t, src, "github/repos/acme/other/git/ref/heads/main")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "outside_token", "policy refused it first")
	for _, a := range gh.Answers()[seen:] {
		assert.NotContains(t, a.URL, "/repos/acme/other")
	}
	req, _ := http.NewRequest(http.MethodGet, gh.URL+"/repos/acme/other/git/ref/heads/main", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "and GitHub refuses the token there")
	return tok
}
