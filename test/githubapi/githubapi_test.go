package githubapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// appJWT is an App JWT as GitHub documents it (RS256, iss the App ID, at most ten minutes).
func appJWT(t *testing.T, k *rsa.PrivateKey, iss string, life time.Duration) string {
	h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	now := time.Now().Unix()
	p, _ := json.Marshal(map[string]any{"iss": iss, "iat": now - 60, "exp": now + int64(life.Seconds())})
	in := h + "." + base64.RawURLEncoding.EncodeToString(p)
	sig := signRS256(t, k, in)
	return in + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func do(t *testing.T, method, url, bearer string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(context.Background(), method, url, rd)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// Every answer the stand-in can give, checked against GitHub's description: the operations,
// statuses and bodies Sandgate and the tests meet.
func TestEveryAnswerFollowsGitHubsDescription(t *testing.T) {
	key, _ := GenerateAppKey(t)
	s := Start(t, &key.PublicKey, "acme", "widgets", "other")
	mint := s.URL + "/app/installations/" + strconv.FormatInt(s.InstallationID, 10) + "/access_tokens"
	app := appJWT(t, key, "4242", 9*time.Minute)

	code, b := do(t, http.MethodPost, mint, app, map[string]any{"repositories": []string{"widgets"}, "permissions": map[string]string{"contents": "read"}})
	require.Equal(t, http.StatusCreated, code, "%s", b)
	var tok struct{ Token string }
	require.NoError(t, json.Unmarshal(b, &tok))

	code, _ = do(t, http.MethodGet, s.URL+"/repos/acme/widgets/git/ref/heads/main", tok.Token, nil)
	assert.Equal(t, http.StatusOK, code, "a granted repository")
	code, _ = do(t, http.MethodGet, s.URL+"/repos/acme/other/git/ref/heads/main", tok.Token, nil)
	assert.Equal(t, http.StatusNotFound, code, "a repository outside the token")
	code, _ = do(t, http.MethodPost, mint, app, map[string]any{"repositories": []string{"elsewhere"}})
	assert.Equal(t, http.StatusUnprocessableEntity, code, "a repository the installation does not have")
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	code, _ = do(t, http.MethodPost, mint, appJWT(t, other, "4242", 9*time.Minute), map[string]any{})
	assert.Equal(t, http.StatusUnauthorized, code, "an App JWT under another key")
	code, _ = do(t, http.MethodPost, mint, appJWT(t, key, "4242", time.Hour), map[string]any{})
	assert.Equal(t, http.StatusUnauthorized, code, "an App JWT longer than ten minutes")
	code, _ = do(t, http.MethodDelete, s.URL+"/installation/token", tok.Token, nil)
	assert.Equal(t, http.StatusNoContent, code)
	assert.Equal(t, tok.Token, <-s.Revoked())
	code, _ = do(t, http.MethodGet, s.URL+"/repos/acme/widgets/git/ref/heads/main", tok.Token, nil)
	assert.Equal(t, http.StatusNotFound, code, "a revoked token reaches nothing")

	answers := s.Answers()
	require.Len(t, answers, 8)
	CheckAnswers(t, answers)
}

// The check catches an answer the description does not allow: a check that passes anything
// would pass a stand-in that drifted from GitHub.
func TestTheDescriptionCheckCatchesADrift(t *testing.T) {
	for name, a := range map[string]Answer{
		"a token answer without expires_at":        {Method: "post", Path: "/app/installations/{installation_id}/access_tokens", Status: 201, Body: []byte(`{"token":"ghs_x"}`)},
		"a status the operation does not document": {Method: "get", Path: "/repos/{owner}/{repo}/git/ref/{ref}", Status: 401, Body: []byte(`{"message":"Bad credentials"}`)},
		"a ref whose object has no sha":            {Method: "get", Path: "/repos/{owner}/{repo}/git/ref/{ref}", Status: 200, Body: []byte(`{"ref":"r","node_id":"n","url":"u","object":{"type":"commit","url":"u"}}`)},
		"an operation GitHub does not have":        {Method: "put", Path: "/installation/token", Status: 204},
	} {
		t.Run(name, func(t *testing.T) {
			ft := &fakeT{TB: t}
			CheckAnswers(ft, []Answer{a})
			assert.True(t, ft.failed, "the check let it pass")
		})
	}
}

// fakeT records Errorf instead of failing: the test of the check itself.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Errorf(string, ...any) { f.failed = true }
