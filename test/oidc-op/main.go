// Command oidc-op is zitadel/oidc's example OpenID provider (github.com/zitadel/oidc/v3, its
// example/server storage and exampleop server) with what token exchange of a Sandgate run token
// needs: the OP verifies a subject token of type urn:ietf:params:oauth:token-type:jwt against
// Sandgate's JWKS (the example only exchanges tokens it issued itself), and issues an access
// token for the run, carrying the run's claims, with a lifetime the tests choose. Everything
// else (client authentication, the token exchange grant, token issuance, revocation) is the
// library's. test/setup.sh builds it into the tools cache.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9998", "listen address (loopback)")
	jwks := flag.String("run-token-jwks", "", "URL of Sandgate's JWKS (the admin listener's /.well-known/jwks.json)")
	runIssuer := flag.String("run-token-issuer", "", "the iss of Sandgate's run tokens")
	clientID := flag.String("client-id", "sandgate", "the client Sandgate authenticates as")
	secret := flag.String("client-secret", "", "its secret")
	ttl := flag.Duration("access-token-ttl", 5*time.Minute, "lifetime of the access tokens issued")
	flag.Parse()
	if *jwks == "" || *runIssuer == "" || *secret == "" {
		log.Fatal("-run-token-jwks, -run-token-issuer and -client-secret are required")
	}
	issuer := "http://" + *addr + "/"
	storage.RegisterClients(storage.WebClient(*clientID, *secret, "http://127.0.0.1/unused"))
	st := &runStorage{Storage: storage.NewStorage(storage.NewUserStore(issuer)),
		keys: rp.NewRemoteKeySet(http.DefaultClient, *jwks), runIssuer: *runIssuer, audience: issuer, ttl: *ttl}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	router := exampleop.SetupServer(issuer, st, logger, false)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("oidc-op listening on", ln.Addr())
	log.Fatal(http.Serve(ln, router))
}

// runStorage is the example's storage with run tokens as exchangeable subject tokens.
type runStorage struct {
	*storage.Storage
	keys      oidc.KeySet
	runIssuer string
	audience  string
	ttl       time.Duration
}

// VerifyExchangeSubjectToken accepts a JWT signed by Sandgate's key for this OP.
func (s *runStorage) VerifyExchangeSubjectToken(ctx context.Context, token string, tokenType oidc.TokenType) (string, string, map[string]any, error) {
	if tokenType != oidc.JWTTokenType {
		return "", "", nil, fmt.Errorf("subject token type %s is not a run token", tokenType)
	}
	claims := new(oidc.TokenClaims)
	payload, err := oidc.ParseToken(token, claims)
	if err != nil {
		return "", "", nil, err
	}
	if err := oidc.CheckSignature(ctx, token, payload, claims, []string{"ES256", "RS256"}, s.keys); err != nil {
		return "", "", nil, err
	}
	if err := oidc.CheckIssuer(claims, s.runIssuer); err != nil {
		return "", "", nil, err
	}
	if !slices.Contains(claims.Audience, s.audience) && !slices.Contains(claims.Audience, strings.TrimSuffix(s.audience, "/")) {
		return "", "", nil, errors.New("run token is not for this OP")
	}
	if err := oidc.CheckExpiration(claims, 0); err != nil {
		return "", "", nil, err
	}
	var all map[string]any
	if err := json.Unmarshal(payload, &all); err != nil {
		return "", "", nil, err
	}
	run := map[string]any{}
	for _, k := range []string{"namespace", "sandbox", "claim", "template", "grants"} {
		run[k] = all[k]
	}
	return claims.JWTID, claims.Subject, map[string]any{"sandgate_run": run}, nil
}

func (s *runStorage) VerifyExchangeActorToken(context.Context, string, oidc.TokenType) (string, string, map[string]any, error) {
	return "", "", nil, errors.New("no actor tokens")
}

// ValidateTokenExchangeRequest issues access tokens for the run token's subject.
func (s *runStorage) ValidateTokenExchangeRequest(_ context.Context, req op.TokenExchangeRequest) error {
	if req.GetRequestedTokenType() == "" {
		req.SetRequestedTokenType(oidc.AccessTokenType)
	}
	if req.GetRequestedTokenType() != oidc.AccessTokenType {
		return errors.New("only access tokens are issued for runs")
	}
	req.SetCurrentScopes(req.GetScopes())
	return nil
}

func (s *runStorage) CreateTokenExchangeRequest(context.Context, op.TokenExchangeRequest) error {
	return nil
}

func (s *runStorage) GetPrivateClaimsFromTokenExchangeRequest(_ context.Context, req op.TokenExchangeRequest) (map[string]any, error) {
	return req.GetExchangeSubjectTokenClaims(), nil
}

func (s *runStorage) SetUserinfoFromTokenExchangeRequest(context.Context, *oidc.UserInfo, op.TokenExchangeRequest) error {
	return nil
}

// CreateAccessToken is the example's, with the lifetime the tests chose.
func (s *runStorage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, _, err := s.Storage.CreateAccessToken(ctx, req)
	return id, time.Now().Add(s.ttl), err
}
