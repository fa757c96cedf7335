package credential

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// A run token is the JWT Sandgate signs for one sandbox run, the subject token of an RFC 8693
// token exchange: the IdP verifies it against Sandgate's JWKS and issues a token scoped to the
// run. Its claims (docs/credentials.md, "The run token"):
//
//	iss       run_tokens.issuer
//	sub       "claim:<namespace>/<claim>", or "sandbox:<namespace>/<sandbox>" where no claim exists
//	aud       the IdP (token_exchange.subject_audience)
//	iat, nbf, exp, jti
//	namespace, sandbox, claim, template   the run, as the identity chain verified it
//	grants    the run's grants (input.grants)

// signer signs JWTs with one key, ES256 (EC P-256) or RS256 (RSA).
type signer struct {
	key crypto.Signer
	alg string
	kid string
	jwk map[string]string
}

// newSigner reads a PEM private key: PKCS #8 (EC or RSA), or SEC 1 EC / PKCS #1 RSA.
func newSigner(pemKey []byte) (*signer, error) {
	block, _ := pem.Decode(pemKey)
	if block == nil {
		return nil, errors.New("no PEM block in the key")
	}
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse the private key: %w", err)
	}
	s := &signer{}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, errors.New("an EC key must be on P-256 (ES256)")
		}
		pub, err := k.PublicKey.Bytes() // 0x04 || X || Y
		if err != nil {
			return nil, fmt.Errorf("encode the public key: %w", err)
		}
		s.key, s.alg = k, "ES256"
		s.jwk = map[string]string{"kty": "EC", "crv": "P-256", "x": b64(pub[1:33]), "y": b64(pub[33:])}
	case *rsa.PrivateKey:
		if k.N.BitLen() < 2048 {
			return nil, errors.New("an RSA key must have at least 2048 bits")
		}
		s.key, s.alg = k, "RS256"
		s.jwk = map[string]string{"kty": "RSA", "n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())}
	default:
		return nil, fmt.Errorf("a %T key cannot sign run tokens: use EC P-256 or RSA", key)
	}
	s.kid = thumbprint(s.jwk)
	return s, nil
}

// thumbprint is the key's RFC 7638 JWK thumbprint: its kid, the same on every replica.
func thumbprint(jwk map[string]string) string {
	var members []string
	if jwk["kty"] == "EC" {
		members = []string{"crv", "kty", "x", "y"}
	} else {
		members = []string{"e", "kty", "n"}
	}
	b := []byte{'{'}
	for i, m := range members {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%q:%q", m, jwk[m])
	}
	sum := sha256.Sum256(append(b, '}'))
	return b64(sum[:])
}

// JWKS is the JSON Web Key Set of the public key: what an IdP verifies run tokens with.
func (s *signer) JWKS() []byte {
	k := map[string]string{"use": "sig", "alg": s.alg, "kid": s.kid}
	for n, v := range s.jwk {
		k[n] = v
	}
	b, _ := json.Marshal(map[string]any{"keys": []any{k}})
	return b
}

// sign returns the compact JWS of claims.
func (s *signer) sign(claims map[string]any) (string, error) {
	header, _ := json.Marshal(map[string]string{"alg": s.alg, "typ": "JWT", "kid": s.kid})
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("encode the claims: %w", err)
	}
	input := b64(header) + "." + b64(payload)
	digest := sha256.Sum256([]byte(input))
	var sig []byte
	switch k := s.key.(type) {
	case *ecdsa.PrivateKey:
		r, ss, err := ecdsa.Sign(rand.Reader, k, digest[:])
		if err != nil {
			return "", fmt.Errorf("sign: %w", err)
		}
		sig = make([]byte, 64) // JWS ES256: R || S, 32 bytes each
		r.FillBytes(sig[:32])
		ss.FillBytes(sig[32:])
	case *rsa.PrivateKey:
		if sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, digest[:]); err != nil {
			return "", fmt.Errorf("sign: %w", err)
		}
	}
	return input + "." + b64(sig), nil
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// RunTokens signs the JWTs of sandbox runs.
type RunTokens struct {
	s        *signer
	issuer   string
	lifetime time.Duration
	now      func() time.Time
}

// NewRunTokens signs with the PEM key for issuer; each token lives lifetime.
func NewRunTokens(pemKey []byte, issuer string, lifetime time.Duration, now func() time.Time) (*RunTokens, error) {
	s, err := newSigner(pemKey)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &RunTokens{s: s, issuer: issuer, lifetime: lifetime, now: now}, nil
}

// JWKS is the public key set (application/jwk-set+json).
func (r *RunTokens) JWKS() []byte { return r.s.JWKS() }

// Sign returns the run token of run for audience.
func (r *RunTokens) Sign(run Run, audience string) (string, error) {
	now := r.now()
	jti := make([]byte, 16)
	_, _ = rand.Read(jti)
	grants := run.Grants
	if grants == nil {
		grants = map[string]any{}
	}
	return r.s.sign(map[string]any{
		"iss": r.issuer, "sub": run.Subject(), "aud": audience,
		"iat": now.Unix(), "nbf": now.Add(-30 * time.Second).Unix(), "exp": now.Add(r.lifetime).Unix(),
		"jti": b64(jti), "namespace": run.Namespace, "sandbox": run.Sandbox, "claim": run.Claim,
		"template": run.Template, "grants": grants,
	})
}
