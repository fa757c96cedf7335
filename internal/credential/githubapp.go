package credential

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// githubProvider mints GitHub App installation tokens, each restricted to the repositories and
// permissions its run's grants name (the token request's repositories and permissions), and
// revokes them (DELETE /installation/token) when the run ends.
type githubProvider struct {
	name string
	cfg  config.GitHubApp
	key  func() (string, bool)
	http *http.Client
	now  func() time.Time
}

// githubAnswerBytes bounds the token answer read.
const githubAnswerBytes = 1 << 20

func (p *githubProvider) kind() string { return config.ProviderGitHubApp }

// scope is the run's granted repositories of the installation's owner and the configured
// permissions, narrowed by the permissions grant.
func (p *githubProvider) scope(run Run) (*policy.Credential, string) {
	s := &policy.Credential{Name: p.name, Provider: config.ProviderGitHubApp, Repositories: []string{},
		Permissions: maps.Clone(p.cfg.Permissions)}
	if list, ok := run.Grants[p.cfg.RepositoriesGrant].([]any); ok {
		for _, v := range list {
			repo, _ := v.(string)
			owner, name, ok := strings.Cut(repo, "/")
			if ok && strings.EqualFold(owner, p.cfg.Owner) && name != "" && !strings.Contains(name, "/") && !slices.Contains(s.Repositories, repo) {
				s.Repositories = append(s.Repositories, repo)
			}
		}
	}
	slices.Sort(s.Repositories)
	if p.cfg.PermissionsGrant != "" {
		narrow, _ := run.Grants[p.cfg.PermissionsGrant].(map[string]any)
		for k, most := range s.Permissions {
			want, _ := narrow[k].(string)
			if config.GitHubLevel(want) < 0 {
				delete(s.Permissions, k) // a run gets only what its grant names
			} else if config.GitHubLevel(want) < config.GitHubLevel(most) {
				s.Permissions[k] = want
			}
		}
	}
	fp := strings.Join(s.Repositories, ",")
	for _, k := range slices.Sorted(maps.Keys(s.Permissions)) {
		fp += ";" + k + "=" + s.Permissions[k]
	}
	return s, fp
}

func (p *githubProvider) mint(ctx context.Context, _ Run, scope *policy.Credential) (string, time.Time, error) {
	if len(scope.Repositories) == 0 {
		// Without repositories GitHub would grant every repository of the installation.
		return "", time.Time{}, reasonf("no repository of %s is granted to this run (grant %s)", p.cfg.Owner, p.cfg.RepositoriesGrant)
	}
	if len(scope.Permissions) == 0 {
		return "", time.Time{}, reasonf("no permission is granted to this run (grant %s)", p.cfg.PermissionsGrant)
	}
	appJWT, err := p.appToken()
	if err != nil {
		return "", time.Time{}, err
	}
	names := make([]string, len(scope.Repositories))
	for i, r := range scope.Repositories {
		_, names[i], _ = strings.Cut(r, "/")
	}
	body, _ := json.Marshal(map[string]any{"repositories": names, "permissions": scope.Permissions})
	url := p.cfg.APIURL + "/app/installations/" + strconv.FormatInt(p.cfg.InstallationID, 10) + "/access_tokens"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", time.Time{}, reasonf("token request: %v", err)
	}
	githubHeaders(req, appJWT)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Do(req)
	if err != nil {
		return "", time.Time{}, endpointReason("GitHub API", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, githubAnswerBytes))
	if err != nil {
		return "", time.Time{}, reasonf("reading GitHub's answer failed")
	}
	if resp.StatusCode != http.StatusCreated {
		return "", time.Time{}, reasonf("GitHub API answered HTTP %d to the installation token request", resp.StatusCode)
	}
	var tok struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(b, &tok); err != nil || tok.Token == "" || tok.ExpiresAt.IsZero() {
		return "", time.Time{}, reasonf("GitHub's answer carries no token and expires_at")
	}
	return tok.Token, tok.ExpiresAt, nil
}

// appToken is the App's JWT (RS256, iss the App ID), valid for nine minutes from a minute ago
// (GitHub allows ten, and clocks drift).
func (p *githubProvider) appToken() (string, error) {
	pem, ok := p.key()
	if !ok {
		return "", reasonf("private key credential %q has no value", p.cfg.PrivateKeyCredential)
	}
	s, err := newSigner([]byte(pem))
	if err != nil || s.alg != "RS256" {
		return "", reasonf("private key credential %q is not the App's RSA key", p.cfg.PrivateKeyCredential)
	}
	now := p.now()
	tok, err := s.sign(map[string]any{"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(9 * time.Minute).Unix(),
		"iss": strconv.FormatInt(p.cfg.AppID, 10)})
	if err != nil {
		return "", reasonf("signing the App token failed: %v", err)
	}
	return tok, nil
}

func (p *githubProvider) revoke(ctx context.Context, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, p.cfg.APIURL+"/installation/token", nil)
	if err != nil {
		return fmt.Errorf("revocation request: %w", err)
	}
	githubHeaders(req, token)
	// 401: already revoked or expired, which is what was asked.
	return answered(p.http, req, "GitHub API", http.StatusNoContent, http.StatusUnauthorized)
}

func githubHeaders(req *http.Request, bearer string) {
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	req.Header.Set("User-Agent", "sandgate")
	req.Header.Set("Authorization", "Bearer "+bearer)
}
