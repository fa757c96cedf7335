package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Credential is a named secret. A static credential has exactly one of File and Env; a minted
// one has exactly one provider (oauth2_client_credentials, token_exchange, github_app) and
// neither, and is minted for each sandbox run (docs/credentials.md).
type Credential struct {
	Name string `json:"name"`
	// File is read at start and re-read when it changes (a mounted Secret).
	File string `json:"file"`
	// Env names an environment variable.
	Env string `json:"env"`

	// OAuth2 mints an OAuth 2.0 access token for each run (client credentials grant).
	OAuth2 *OAuth2ClientCredentials `json:"oauth2_client_credentials"`
	// TokenExchange exchanges a JWT Sandgate signs for the run at an IdP (RFC 8693).
	TokenExchange *TokenExchange `json:"token_exchange"`
	// GitHubApp mints a GitHub App installation token for each run, restricted to the
	// repositories and permissions its grants name.
	GitHubApp *GitHubApp `json:"github_app"`
}

// Provider names (input.credential.provider, the audit event's credential_token.provider, the
// provider metric label).
const (
	ProviderStatic        = "static"
	ProviderOAuth2        = "oauth2_client_credentials"
	ProviderTokenExchange = "token_exchange"
	ProviderGitHubApp     = "github_app"
)

// Provider is the credential's provider name.
func (c Credential) Provider() string {
	switch {
	case c.OAuth2 != nil:
		return ProviderOAuth2
	case c.TokenExchange != nil:
		return ProviderTokenExchange
	case c.GitHubApp != nil:
		return ProviderGitHubApp
	}
	return ProviderStatic
}

// Minted reports whether the credential is minted per run rather than read from a file or the
// environment.
func (c Credential) Minted() bool { return c.Provider() != ProviderStatic }

// Minting is what every minting provider shares.
type Minting struct {
	// RefreshBefore mints the next token this long before the current one expires (default 1m,
	// at most half the token's lifetime): callers never wait for a refresh.
	RefreshBefore Duration `json:"refresh_before"`
	// Timeout bounds one request to the provider (default 10s).
	Timeout Duration `json:"timeout"`
}

// OAuth2ClientCredentials is an OAuth 2.0 token endpoint Sandgate authenticates to as a
// client (RFC 6749 section 4.4).
type OAuth2ClientCredentials struct {
	Minting
	TokenURL string `json:"token_url"`
	ClientID string `json:"client_id"`
	// ClientSecretCredential names the static credential holding the client secret.
	ClientSecretCredential string `json:"client_secret_credential"`
	// AuthMethod is client_secret_basic (default) or client_secret_post.
	AuthMethod string   `json:"auth_method"`
	Scopes     []string `json:"scopes"`
	// Audience is sent as the audience parameter (Hydra, Auth0, Okta read it).
	Audience []string `json:"audience"`
	// RevocationURL, when set, is where a run's token is revoked when the run ends (RFC 7009).
	RevocationURL string `json:"revocation_url"`
}

// TokenExchange is an RFC 8693 token exchange whose subject token is a short-lived JWT
// Sandgate signs for the run (run_tokens). The client fields are OAuth2ClientCredentials'.
type TokenExchange struct {
	OAuth2ClientCredentials
	// RequestedTokenType defaults to urn:ietf:params:oauth:token-type:access_token.
	RequestedTokenType string `json:"requested_token_type"`
	// Resource is sent as the resource parameter.
	Resource string `json:"resource"`
	// SubjectAudience is the aud of the JWT Sandgate signs: the IdP (default: token_url's
	// origin).
	SubjectAudience string `json:"subject_audience"`
}

// GitHubApp mints installation tokens of a GitHub App.
type GitHubApp struct {
	Minting
	// APIURL is GitHub's REST API (default https://api.github.com).
	APIURL         string `json:"api_url"`
	AppID          int64  `json:"app_id"`
	InstallationID int64  `json:"installation_id"`
	// Owner is the account the installation belongs to: only the granted repositories of
	// this owner go into a token.
	Owner string `json:"owner"`
	// PrivateKeyCredential names the static credential holding the App's private key (PEM).
	PrivateKeyCredential string `json:"private_key_credential"`
	// RepositoriesGrant names the grant listing a run's repositories as "owner/repo" (default
	// github_repos, the shipped policy's).
	RepositoriesGrant string `json:"repositories_grant"`
	// Permissions are the most a token may get (contents: read …).
	Permissions map[string]string `json:"permissions"`
	// PermissionsGrant, when set, names a grant (an object like permissions) that narrows
	// permissions for a run: a permission it names at a level no higher than permissions'.
	PermissionsGrant string `json:"permissions_grant"`
}

// RunTokens configures the JWTs Sandgate signs for sandbox runs, the subject tokens of
// token_exchange credentials. Their keys are published as a JWKS on the admin listener
// (/.well-known/jwks.json) and, when jwks_secret is set, in that Kubernetes Secret.
type RunTokens struct {
	// Issuer is the iss of every run token (this Sandgate's URL as the IdP knows it).
	Issuer string `json:"issuer"`
	// KeyCredential names the static credential holding the signing key: a PEM PKCS #8 EC
	// P-256 (ES256) or RSA (RS256) private key. Every replica must have the same.
	KeyCredential string `json:"key_credential"`
	// Lifetime of a run token (default 5m): it is used once, for one exchange.
	Lifetime Duration `json:"lifetime"`
	// JWKSSecret, when set, is a Secret Sandgate keeps holding the JWKS under jwks.json
	// (Kubernetes only), for an IdP that reads keys from a file.
	JWKSSecret *SecretRef `json:"jwks_secret"`
}

// SecretRef names a Kubernetes Secret.
type SecretRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Token types of RFC 8693.
const (
	TokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
	TokenTypeJWT         = "urn:ietf:params:oauth:token-type:jwt"
)

// GitHub permission levels, lowest first.
var githubLevels = []string{"read", "write", "admin"}

// GitHubLevel is the rank of a permission level (read < write < admin), -1 for an unknown one.
func GitHubLevel(l string) int { return slices.Index(githubLevels, l) }

func (c *Credential) applyDefaults(cfg *Config) {
	if c.File != "" {
		c.File = cfg.Path(c.File)
	}
	var m *Minting
	switch {
	case c.OAuth2 != nil:
		m = &c.OAuth2.Minting
		c.OAuth2.applyDefaults()
	case c.TokenExchange != nil:
		m = &c.TokenExchange.Minting
		c.TokenExchange.applyDefaults()
		if c.TokenExchange.RequestedTokenType == "" {
			c.TokenExchange.RequestedTokenType = TokenTypeAccessToken
		}
		if c.TokenExchange.SubjectAudience == "" {
			if u, err := url.Parse(c.TokenExchange.TokenURL); err == nil {
				c.TokenExchange.SubjectAudience = u.Scheme + "://" + u.Host
			}
		}
	case c.GitHubApp != nil:
		m = &c.GitHubApp.Minting
		if c.GitHubApp.APIURL == "" {
			c.GitHubApp.APIURL = "https://api.github.com"
		}
		c.GitHubApp.APIURL = strings.TrimSuffix(c.GitHubApp.APIURL, "/")
		if c.GitHubApp.RepositoriesGrant == "" {
			c.GitHubApp.RepositoriesGrant = "github_repos"
		}
	}
	if m != nil {
		if m.RefreshBefore == 0 {
			m.RefreshBefore = Duration(time.Minute)
		}
		if m.Timeout == 0 {
			m.Timeout = Duration(10 * time.Second)
		}
	}
}

func (o *OAuth2ClientCredentials) applyDefaults() {
	if o.AuthMethod == "" {
		o.AuthMethod = "client_secret_basic"
	}
}

func (r *RunTokens) applyDefaults() {
	if r.Lifetime == 0 {
		r.Lifetime = Duration(5 * time.Minute)
	}
}

// validate checks credentials[i]; names are the credentials defined so far.
func (c *Credential) validate(cfg *Config, f string, errs *fieldErrors) {
	providers := 0
	for _, set := range []bool{c.OAuth2 != nil, c.TokenExchange != nil, c.GitHubApp != nil} {
		if set {
			providers++
		}
	}
	switch {
	case providers == 0 && (c.File == "") == (c.Env == ""):
		errs.add(f, "set exactly one of file or env (credential values are never written in the config)")
	case providers > 1:
		errs.add(f, "set one provider of oauth2_client_credentials, token_exchange, github_app")
	case providers == 1 && (c.File != "" || c.Env != ""):
		errs.add(f, "a minted credential (%s) has no file or env: its value is minted for each run", c.Provider())
	}
	switch {
	case c.OAuth2 != nil:
		c.OAuth2.validate(cfg, f+".oauth2_client_credentials", errs)
		c.OAuth2.Minting.validate(f+".oauth2_client_credentials", errs)
	case c.TokenExchange != nil:
		te := c.TokenExchange
		f += ".token_exchange"
		te.OAuth2ClientCredentials.validate(cfg, f, errs)
		te.Minting.validate(f, errs)
		if cfg.RunTokens == nil {
			errs.add(f, "needs run_tokens: the JWT Sandgate signs for the run is the subject token")
		}
		if te.RequestedTokenType != TokenTypeAccessToken && te.RequestedTokenType != TokenTypeJWT {
			errs.add(f+".requested_token_type", "%q is not one of %s, %s", te.RequestedTokenType, TokenTypeAccessToken, TokenTypeJWT)
		}
	case c.GitHubApp != nil:
		c.GitHubApp.validate(cfg, f+".github_app", errs)
	}
}

func (m Minting) validate(f string, errs *fieldErrors) {
	if m.Timeout.D() <= 0 || m.Timeout.D() > time.Minute {
		errs.add(f+".timeout", "must be between 0 and 1m, got %s", m.Timeout.D())
	}
	if m.RefreshBefore.D() <= 0 {
		errs.add(f+".refresh_before", "must be positive, got %s", m.RefreshBefore.D())
	}
}

func (o *OAuth2ClientCredentials) validate(cfg *Config, f string, errs *fieldErrors) {
	validateEndpoint(f+".token_url", o.TokenURL, true, errs)
	validateEndpoint(f+".revocation_url", o.RevocationURL, false, errs)
	if o.ClientID == "" {
		errs.add(f+".client_id", "must not be empty")
	}
	cfg.staticRef(f+".client_secret_credential", o.ClientSecretCredential, true, errs)
	if o.AuthMethod != "client_secret_basic" && o.AuthMethod != "client_secret_post" {
		errs.add(f+".auth_method", "%q is not one of client_secret_basic, client_secret_post", o.AuthMethod)
	}
	for i, s := range o.Scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n\"\\") {
			errs.add(fmt.Sprintf("%s.scopes[%d]", f, i), "%q is not an OAuth scope token", s)
		}
	}
}

func (g *GitHubApp) validate(cfg *Config, f string, errs *fieldErrors) {
	g.Minting.validate(f, errs)
	validateEndpoint(f+".api_url", g.APIURL, true, errs)
	if g.AppID <= 0 {
		errs.add(f+".app_id", "must be the App's numeric ID")
	}
	if g.InstallationID <= 0 {
		errs.add(f+".installation_id", "must be the installation's numeric ID")
	}
	if !validName(g.Owner) {
		errs.add(f+".owner", "must be the account the installation belongs to, got %q", g.Owner)
	}
	cfg.staticRef(f+".private_key_credential", g.PrivateKeyCredential, true, errs)
	if len(g.Permissions) == 0 {
		errs.add(f+".permissions", "name at least one permission (contents: read …): a token never gets every permission of the App")
	}
	for k, v := range g.Permissions {
		if GitHubLevel(v) < 0 {
			errs.add(f+".permissions."+k, "%q is not one of read, write, admin", v)
		}
	}
}

// validateEndpoint checks an http(s) URL; plain http is for loopback stand-ins and in-cluster
// IdPs behind a mesh.
func validateEndpoint(field, s string, required bool, errs *fieldErrors) {
	if s == "" {
		if required {
			errs.add(field, "must not be empty")
		}
		return
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		errs.add(field, "%q is not an http(s) URL", s)
	}
}

// staticRef checks that name (at field) is a static credential: a value minted per run cannot
// key a chain, authenticate Sandgate itself or a stdio server.
func (c *Config) staticRef(field, name string, required bool, errs *fieldErrors) {
	if name == "" {
		if required {
			errs.add(field, "must name a credential")
		}
		return
	}
	cr, ok := c.credential(name)
	switch {
	case !ok:
		errs.add(field, "no credential named %q in credentials", name)
	case cr.Minted():
		errs.add(field, "credential %q is minted per sandbox run (%s); this needs a static credential (file or env)", name, cr.Provider())
	}
}

func (c *Config) credential(name string) (Credential, bool) {
	for _, cr := range c.Credentials {
		if cr.Name == name {
			return cr, true
		}
	}
	return Credential{}, false
}

// validateCredentials checks credentials, run_tokens, and that every field that needs a static
// credential names one.
func (c *Config) validateCredentials(errs *fieldErrors) {
	names := map[string]int{}
	for i := range c.Credentials {
		cr := &c.Credentials[i]
		f := fmt.Sprintf("credentials[%d]", i)
		switch {
		case cr.Name == "":
			errs.add(f+".name", "must not be empty")
		case !validName(cr.Name):
			errs.add(f+".name", "%q may contain only letters, digits, '-', '_' and '.'", cr.Name)
		}
		errs.unique(names, "credentials", i, cr.Name)
		cr.validate(c, f, errs)
	}
	if r := c.RunTokens; r != nil {
		validateEndpoint("run_tokens.issuer", r.Issuer, true, errs)
		c.staticRef("run_tokens.key_credential", r.KeyCredential, true, errs)
		if d := r.Lifetime.D(); d < 10*time.Second || d > time.Hour {
			errs.add("run_tokens.lifetime", "must be between 10s and 1h, got %s", d)
		}
		if s := r.JWKSSecret; s != nil && (!validName(s.Namespace) || !validName(s.Name)) {
			errs.add("run_tokens.jwks_secret", "needs a namespace and a name")
		}
		if s := r.JWKSSecret; s != nil && !c.Kubernetes.Enabled {
			errs.add("run_tokens.jwks_secret", "needs kubernetes.enabled")
		}
	}
	for field, name := range map[string]string{
		"admin.token_credential":                  c.Admin.TokenCredential,
		"audit.chain_key_credential":              c.Audit.ChainKeyCredential,
		"audit.checkpoint.signing_key_credential": c.Audit.Checkpoint.SigningKeyCredential,
		"redis.password_credential":               c.Redis.PasswordCredential,
		"redis.sentinel.password_credential":      sentinelPassword(c.Redis.Sentinel),
	} {
		if cr, ok := c.credential(name); ok && cr.Minted() {
			errs.add(field, "credential %q is minted per sandbox run (%s); this needs a static credential (file or env)", name, cr.Provider())
		}
	}
	for i, u := range c.Gateway.Upstreams {
		for env, name := range u.CredentialEnv {
			if cr, ok := c.credential(name); ok && cr.Minted() {
				errs.add(fmt.Sprintf("gateway.upstreams[%d].credential_env.%s", i, env),
					"credential %q is minted per sandbox run: a stdio server's environment is set once, for every run; use a static credential", name)
			}
		}
	}
	if o := c.Audit.OTLP.HeaderCredential; o != nil {
		if cr, ok := c.credential(o.Name); ok && cr.Minted() {
			errs.add("audit.otlp.header_credential.name", "credential %q is minted per sandbox run; this needs a static credential (file or env)", o.Name)
		}
	}
}
