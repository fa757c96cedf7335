package credential

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// assumedLifetime is the lifetime of a token whose answer does not say (no expires_in).
const assumedLifetime = 5 * time.Minute

// oauthErrors are RFC 6749's and RFC 8693's error codes: the only part of a token endpoint's
// error answer a reason repeats (as Sandgate's own words, from this list).
var oauthErrors = []string{"invalid_request", "invalid_client", "invalid_grant", "unauthorized_client",
	"unsupported_grant_type", "invalid_scope", "invalid_target", "access_denied", "server_error", "temporarily_unavailable"}

// oauthProvider mints OAuth 2.0 access tokens at a token endpoint: with the client
// credentials grant, or (exchange set) with a token exchange whose subject token is the run's
// JWT.
type oauthProvider struct {
	name     string
	cfg      config.OAuth2ClientCredentials
	exchange *config.TokenExchange // nil: client credentials
	tokens   *RunTokens
	secret   func() (string, bool)
	http     *http.Client
	static   *policy.Credential // the scope: the same for every run
}

func newOAuthProvider(name string, cfg config.OAuth2ClientCredentials, te *config.TokenExchange, tokens *RunTokens, secret func() (string, bool), hc *http.Client) *oauthProvider {
	kind := config.ProviderOAuth2
	if te != nil {
		kind = config.ProviderTokenExchange
	}
	return &oauthProvider{name: name, cfg: cfg, exchange: te, tokens: tokens, secret: secret, http: hc,
		static: &policy.Credential{Name: name, Provider: kind, Audience: cfg.Audience, Scopes: cfg.Scopes}}
}

func (p *oauthProvider) kind() string { return p.static.Provider }

// scope is the same for every run. A token exchange's token is minted for the run token's
// claims, grants included: its fingerprint changes with them, so a changed grant re-mints.
func (p *oauthProvider) scope(run Run) (*policy.Credential, string) {
	if p.exchange == nil {
		return p.static, ""
	}
	b, _ := json.Marshal(struct {
		T string         `json:"t"`
		G map[string]any `json:"g"`
	}{run.Template, run.Grants})
	sum := sha256.Sum256(b)
	return p.static, hex.EncodeToString(sum[:8])
}

func (p *oauthProvider) mint(ctx context.Context, run Run, _ *policy.Credential) (string, time.Time, error) {
	secret, ok := p.secret()
	if !ok {
		return "", time.Time{}, reasonf("client secret credential %q has no value", p.cfg.ClientSecretCredential)
	}
	cc := clientcredentials.Config{ClientID: p.cfg.ClientID, ClientSecret: secret, TokenURL: p.cfg.TokenURL,
		Scopes: p.cfg.Scopes, AuthStyle: authStyle(p.cfg.AuthMethod), EndpointParams: url.Values{}}
	if len(p.cfg.Audience) > 0 {
		cc.EndpointParams["audience"] = p.cfg.Audience
	}
	if te := p.exchange; te != nil {
		subject, err := p.tokens.Sign(run, te.SubjectAudience)
		if err != nil {
			return "", time.Time{}, reasonf("signing the run token failed: %v", err)
		}
		cc.EndpointParams.Set("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange")
		cc.EndpointParams.Set("subject_token", subject)
		cc.EndpointParams.Set("subject_token_type", config.TokenTypeJWT)
		cc.EndpointParams.Set("requested_token_type", te.RequestedTokenType)
		if te.Resource != "" {
			cc.EndpointParams.Set("resource", te.Resource)
		}
	}
	tok, err := cc.Token(context.WithValue(ctx, oauth2.HTTPClient, p.http))
	if err != nil {
		return "", time.Time{}, endpointReason("token endpoint", err)
	}
	if tok.AccessToken == "" {
		return "", time.Time{}, reasonf("the token endpoint's answer carries no access_token")
	}
	exp := tok.Expiry
	if exp.IsZero() {
		exp = time.Now().Add(assumedLifetime)
	}
	return tok.AccessToken, exp, nil
}

// revoke revokes token at the revocation endpoint (RFC 7009), when one is configured.
func (p *oauthProvider) revoke(ctx context.Context, token string) error {
	if p.cfg.RevocationURL == "" {
		return errNoRevocation
	}
	secret, _ := p.secret()
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	if p.cfg.AuthMethod == "client_secret_post" {
		form.Set("client_id", p.cfg.ClientID)
		form.Set("client_secret", secret)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.RevocationURL, strings.NewReader(form.Encode()))
	if err != nil {
		return reasonf("revocation request: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if p.cfg.AuthMethod != "client_secret_post" {
		req.SetBasicAuth(url.QueryEscape(p.cfg.ClientID), url.QueryEscape(secret))
	}
	return answered(p.http, req, "revocation endpoint", http.StatusOK)
}

func authStyle(method string) oauth2.AuthStyle {
	if method == "client_secret_post" {
		return oauth2.AuthStyleInParams
	}
	return oauth2.AuthStyleInHeader
}

// answered sends req and reads at most 64 KiB of the answer, which must have one of want.
func answered(hc *http.Client, req *http.Request, what string, want ...int) error {
	resp, err := hc.Do(req)
	if err != nil {
		return endpointReason(what, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if !slices.Contains(want, resp.StatusCode) {
		return reasonf("%s answered HTTP %d", what, resp.StatusCode)
	}
	return nil
}

// Reason is why a provider could not mint or revoke, in Sandgate's own words: it goes into the
// refusal a sandbox reads and the event, and never carries bytes the provider chose.
type Reason struct{ text string }

func (r *Reason) Error() string { return r.text }

func reasonf(format string, args ...any) error { return &Reason{fmt.Sprintf(format, args...)} }

// errNoRevocation says the provider has no way to revoke a token: it is forgotten and
// expires.
var errNoRevocation = errors.New("the provider has no revocation endpoint")

// endpointReason says what went wrong talking to what, without the endpoint's own text: its
// HTTP status and, from oauthErrors, its error code.
func endpointReason(what string, err error) error {
	var re *oauth2.RetrieveError
	switch {
	case errors.As(err, &re) && re.Response != nil:
		if slices.Contains(oauthErrors, re.ErrorCode) {
			return reasonf("%s answered HTTP %d (%s)", what, re.Response.StatusCode, re.ErrorCode)
		}
		return reasonf("%s answered HTTP %d", what, re.Response.StatusCode)
	case errors.Is(err, context.DeadlineExceeded):
		return reasonf("%s did not answer in time", what)
	case errors.Is(err, context.Canceled):
		return reasonf("the request to the %s was cancelled", what)
	}
	var r *Reason
	if errors.As(err, &r) {
		return r
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return reasonf("%s unreachable", what)
	}
	return reasonf("the %s's answer is not a token answer", what)
}
