// Package githubapi is a stand-in for GitHub's REST API, for the tests of GitHub App
// installation tokens (docs/credentials.md): GitHub cannot be reached from here. It answers the
// operations Sandgate and the tests use, each in the shape GitHub's published OpenAPI
// description (@octokit/openapi, installed by test/setup.sh) gives that operation's answer, and
// keeps every answer it gave so that a test checks each against the description
// (TestEveryAnswerFollowsGitHubsDescription).
//
//	POST   /app/installations/{installation_id}/access_tokens  an App JWT (RS256) mints a token for the repositories and permissions asked
//	DELETE /installation/token                                   the token revokes itself
//	GET    /repos/{owner}/{repo}/git/ref/{ref}                   a token reaches only its repositories (404 otherwise, as GitHub answers)
//
// It listens on loopback only.
package githubapi

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Answer is one answer the stand-in gave: the operation (method and OpenAPI path template) and
// what it sent.
type Answer struct {
	Method, Path string
	// URL is the request's path as sent.
	URL    string
	Status int
	Body   []byte
}

// Token is an installation token the stand-in minted.
type Token struct {
	Value        string
	Repositories []string // "owner/repo"
	Permissions  map[string]string
	Expires      time.Time
	Revoked      bool
}

// Server is the stand-in.
type Server struct {
	URL            string
	AppID          int64
	InstallationID int64
	Owner          string
	// Lifetime of the tokens it mints (GitHub's is an hour).
	Lifetime time.Duration

	key     *rsa.PublicKey
	repos   map[string]int64 // repositories of the installation's owner
	handler http.Handler
	addr    string
	srv     *http.Server

	mu      sync.Mutex
	tokens  map[string]*Token
	answers []Answer
	revoked chan string
}

// Start runs a stand-in whose App has key and whose installation holds repos of owner.
func Start(t testing.TB, key *rsa.PublicKey, owner string, repos ...string) *Server {
	s := &Server{AppID: 4242, InstallationID: 777, Owner: owner, Lifetime: time.Hour, key: key,
		repos: map[string]int64{}, tokens: map[string]*Token{}, revoked: make(chan string, 64)}
	for i, r := range repos {
		s.repos[r] = int64(1000 + i)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /app/installations/{installation_id}/access_tokens", s.mintToken)
	mux.HandleFunc("DELETE /installation/token", s.revokeToken)
	mux.HandleFunc("GET /repos/{owner}/{repo}/git/ref/{ref...}", s.getRef)
	s.handler = mux
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.URL = "http://" + s.addr
	s.serve(ln)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(ln net.Listener) {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// Stop closes the stand-in: GitHub is unreachable until Start.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Start serves again on the same address; the tokens minted before stay valid.
func (s *Server) Start(t testing.TB) {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	s.serve(ln)
}

// GenerateAppKey is a new App private key, PEM (PKCS #1, as GitHub hands them out).
func GenerateAppKey(t testing.TB) (*rsa.PrivateKey, []byte) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der := pemBlock("RSA PRIVATE KEY", x509PKCS1(k))
	return k, der
}

// Answers are the answers given so far.
func (s *Server) Answers() []Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.answers)
}

// Tokens are the tokens minted so far, in no order.
func (s *Server) Tokens() []Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Token
	for _, tk := range s.tokens {
		c := *tk
		out = append(out, c)
	}
	return out
}

// Revoked receives each token revoked (DELETE /installation/token).
func (s *Server) Revoked() <-chan string { return s.revoked }

func (s *Server) answer(w http.ResponseWriter, r *http.Request, path string, status int, body any) {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	s.mu.Lock()
	s.answers = append(s.answers, Answer{Method: strings.ToLower(r.Method), Path: path, URL: r.URL.Path, Status: status, Body: b})
	s.mu.Unlock()
	w.Header().Set("X-GitHub-Api-Version-Selected", "2022-11-28")
	if b != nil {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func basicError(msg string) map[string]any {
	return map[string]any{"message": msg, "documentation_url": "https://docs.github.com/rest", "status": "0"}
}

// mintToken checks the App JWT and mints an installation token restricted as asked.
func (s *Server) mintToken(w http.ResponseWriter, r *http.Request) {
	const op = "/app/installations/{installation_id}/access_tokens"
	if err := s.checkAppJWT(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")); err != nil {
		s.answer(w, r, op, http.StatusUnauthorized, basicError("A JSON web token could not be decoded: "+err.Error()))
		return
	}
	if r.PathValue("installation_id") != strconv.FormatInt(s.InstallationID, 10) {
		s.answer(w, r, op, http.StatusNotFound, basicError("Not Found"))
		return
	}
	var req struct {
		Repositories []string          `json:"repositories"`
		Permissions  map[string]string `json:"permissions"`
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(b, &req); err != nil {
		s.answer(w, r, op, http.StatusUnprocessableEntity, map[string]any{"message": "Problems parsing JSON", "documentation_url": "https://docs.github.com/rest"})
		return
	}
	tk := &Token{Permissions: req.Permissions, Expires: time.Now().Add(s.Lifetime).UTC().Truncate(time.Second)}
	if len(req.Repositories) == 0 {
		for name := range s.repos {
			tk.Repositories = append(tk.Repositories, s.Owner+"/"+name) // every repository: what Sandgate must never ask for
		}
	}
	for _, name := range req.Repositories {
		if _, ok := s.repos[name]; !ok {
			s.answer(w, r, op, http.StatusUnprocessableEntity, map[string]any{"message": "There is at least one repository that does not exist or is not accessible to the parent installation.",
				"documentation_url": "https://docs.github.com/rest"})
			return
		}
		tk.Repositories = append(tk.Repositories, s.Owner+"/"+name)
	}
	raw := make([]byte, 27)
	_, _ = rand.Read(raw)
	tk.Value = "ghs_" + base64.RawURLEncoding.EncodeToString(raw)
	s.mu.Lock()
	s.tokens[tk.Value] = tk
	s.mu.Unlock()
	perms := map[string]any{}
	for k, v := range req.Permissions {
		perms[k] = v
	}
	s.answer(w, r, op, http.StatusCreated, map[string]any{"token": tk.Value, "expires_at": tk.Expires.Format(time.RFC3339),
		"permissions": perms, "repository_selection": "selected"})
}

// token is the live token r carries, or nil.
func (s *Server) token(r *http.Request) *Token {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		v, ok = strings.CutPrefix(r.Header.Get("Authorization"), "token ")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tk := s.tokens[v]
	if !ok || tk == nil || tk.Revoked || time.Now().After(tk.Expires) {
		return nil
	}
	return tk
}

// revokeToken revokes the token the request carries. The description has one answer, 204: a
// token revoked already, or expired, is revoked.
func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) {
	tk := s.token(r)
	if tk != nil {
		s.mu.Lock()
		tk.Revoked = true
		s.mu.Unlock()
	}
	s.answer(w, r, "/installation/token", http.StatusNoContent, nil)
	if tk != nil {
		s.revoked <- tk.Value
	}
}

func (s *Server) getRef(w http.ResponseWriter, r *http.Request) {
	const op = "/repos/{owner}/{repo}/git/ref/{ref}"
	tk := s.token(r)
	repo := r.PathValue("owner") + "/" + r.PathValue("repo")
	// No token, a revoked one, or one without the repository: GitHub answers as if the
	// repository did not exist.
	if tk == nil || !slices.Contains(tk.Repositories, repo) || tk.Permissions["contents"] == "" {
		s.answer(w, r, op, http.StatusNotFound, basicError("Not Found"))
		return
	}
	ref := "refs/" + r.PathValue("ref")
	sum := sha256.Sum256([]byte(repo + ref))
	sha := hex.EncodeToString(sum[:20])
	url := s.URL + "/repos/" + repo + "/git/" + ref
	s.answer(w, r, op, http.StatusOK, map[string]any{"ref": ref, "node_id": "REF_" + sha[:12], "url": url,
		"object": map[string]any{"type": "commit", "sha": sha, "url": s.URL + "/repos/" + repo + "/git/commits/" + sha}})
}

// checkAppJWT verifies the App's JWT: RS256 under the App's key, issued by the App, at most ten
// minutes long, not expired.
func (s *Server) checkAppJWT(tok string) error {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return fmt.Errorf("not a JWT")
	}
	var hdr struct{ Alg string }
	hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
	if json.Unmarshal(hb, &hdr) != nil || hdr.Alg != "RS256" {
		return fmt.Errorf("alg is not RS256")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return err
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(s.key, crypto.SHA256, digest[:], sig); err != nil {
		return fmt.Errorf("bad signature")
	}
	var c struct {
		Iss      string `json:"iss"`
		Iat, Exp int64
	}
	pb, _ := base64.RawURLEncoding.DecodeString(parts[1])
	if err := json.Unmarshal(pb, &c); err != nil {
		return err
	}
	now := time.Now().Unix()
	switch {
	case c.Iss != strconv.FormatInt(s.AppID, 10):
		return fmt.Errorf("iss is not the App")
	case c.Exp <= now || c.Exp-c.Iat > 600 || c.Iat > now+60:
		return fmt.Errorf("'Expiration time' claim ('exp') is too far in the future or past")
	}
	return nil
}

func x509PKCS1(k *rsa.PrivateKey) []byte { return x509.MarshalPKCS1PrivateKey(k) }

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// signRS256 is an RS256 signature of in, for tests that sign App JWTs themselves.
func signRS256(t testing.TB, k *rsa.PrivateKey, in string) []byte {
	d := sha256.Sum256([]byte(in))
	sig, err := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, d[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}
