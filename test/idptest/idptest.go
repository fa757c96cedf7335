// Package idptest runs the real identity providers of the minted-credential tests on loopback:
// Ory Hydra v2.3.0 (OAuth 2.0 client credentials, RFC 7009 revocation, RFC 7662 introspection)
// and zitadel/oidc's example OpenID provider with run-token exchange (test/oidc-op). Both are
// built by test/setup.sh into the tools cache (.tools/bin); a test whose tool is missing is
// skipped, or fails under SANDGATE_REQUIRE_TOOLS. Each can be stopped and started again on its
// addresses, for the tests of an IdP that is down.
package idptest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Tool is the path of a tool test/setup.sh builds into .tools/bin.
func Tool(t testing.TB, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", ".tools", "bin", name)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s is missing (SANDGATE_REQUIRE_TOOLS is set): run test/setup.sh", p)
		}
		t.Skipf("%s is missing: run test/setup.sh (set SANDGATE_REQUIRE_TOOLS=1 to fail instead)", p)
	}
	return p
}

// FreeAddr is a loopback address no one listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// process is a server process that can be stopped and started again with the same arguments.
type process struct {
	t    testing.TB
	name string
	bin  string
	args []string
	env  []string
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
}

func (p *process) start(ready func() error) {
	p.t.Helper()
	p.mu.Lock()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Dir = p.dir
	p.log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := ready()
		if err == nil {
			return
		}
		select {
		case <-done:
			p.t.Fatalf("%s exited: %s", p.name, p.log.String())
		default:
		}
		if time.Now().After(deadline) {
			p.Stop()
			p.t.Fatalf("%s not ready: %v\n%s", p.name, err, p.log.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a server's readiness: no event to wait on
	}
}

// Stop kills the process and waits for it to exit.
func (p *process) Stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

func get(u string) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d", u, resp.StatusCode)
	}
	return nil
}

// Hydra is Ory Hydra serving its public API (token, revocation) and admin API (clients,
// introspection) on loopback, with an in-memory database: a restart forgets its clients, and
// Start registers them again.
type Hydra struct {
	process
	Public, Admin string // base URLs
	mu            sync.Mutex
	clients       []map[string]any
}

// StartHydra runs Hydra issuing access tokens that live ttl.
func StartHydra(t testing.TB, ttl time.Duration) *Hydra {
	pub, adm := FreeAddr(t), FreeAddr(t)
	ph, pp, _ := net.SplitHostPort(pub)
	ah, ap, _ := net.SplitHostPort(adm)
	h := &Hydra{Public: "http://" + pub, Admin: "http://" + adm}
	h.process = process{t: t, name: "hydra", bin: Tool(t, "hydra"), args: []string{"serve", "all", "--dev"}, dir: t.TempDir(),
		env: []string{"DSN=memory", "SECRETS_SYSTEM=sandgate-test-secret-32-bytes-long!!", "SERVE_PUBLIC_HOST=" + ph, "SERVE_PUBLIC_PORT=" + pp,
			"SERVE_ADMIN_HOST=" + ah, "SERVE_ADMIN_PORT=" + ap, "URLS_SELF_ISSUER=" + h.Public, "TTL_ACCESS_TOKEN=" + ttl.String(),
			"LOG_LEVEL=warn", "SQA_OPT_OUT=true", "STRATEGIES_ACCESS_TOKEN=opaque"}}
	h.Start()
	t.Cleanup(h.Stop)
	return h
}

// Start starts Hydra (again) and registers the clients created so far.
func (h *Hydra) Start() {
	h.start(func() error { return get(h.Public + "/health/ready") })
	h.mu.Lock()
	clients := append([]map[string]any(nil), h.clients...)
	h.mu.Unlock()
	for _, c := range clients {
		h.postClient(c)
	}
}

// CreateClient registers a confidential client of the client credentials grant.
func (h *Hydra) CreateClient(id, secret string, audience, scopes []string) {
	c := map[string]any{"client_id": id, "client_secret": secret, "grant_types": []string{"client_credentials"},
		"token_endpoint_auth_method": "client_secret_basic", "audience": audience, "scope": strings.Join(scopes, " ")}
	h.mu.Lock()
	h.clients = append(h.clients, c)
	h.mu.Unlock()
	h.postClient(c)
}

func (h *Hydra) postClient(c map[string]any) {
	b, _ := json.Marshal(c)
	resp, err := http.Post(h.Admin+"/admin/clients", "application/json", bytes.NewReader(b))
	if err != nil {
		h.t.Fatalf("create hydra client: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		body, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("create hydra client: %d %s", resp.StatusCode, body)
	}
}

// Introspection is what Hydra says of a token (RFC 7662).
type Introspection struct {
	Active   bool     `json:"active"`
	ClientID string   `json:"client_id"`
	Audience []string `json:"aud"`
	Scope    string   `json:"scope"`
	Exp      int64    `json:"exp"`
}

// Introspect asks Hydra's admin API about token.
func (h *Hydra) Introspect(token string) Introspection {
	resp, err := http.PostForm(h.Admin+"/admin/oauth2/introspect", url.Values{"token": {token}})
	if err != nil {
		h.t.Fatalf("introspect: %v", err)
	}
	defer resp.Body.Close()
	var in Introspection
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		h.t.Fatalf("introspect: %v", err)
	}
	return in
}

// OIDCOP is zitadel/oidc's example OP with run-token exchange (test/oidc-op).
type OIDCOP struct {
	process
	URL      string // the issuer, with its trailing slash
	ClientID string
	Secret   string
}

// StartOIDCOP runs the OP verifying run tokens of runIssuer against the JWKS at jwksURL and
// issuing access tokens that live ttl. The JWKS need not be served yet.
func StartOIDCOP(t testing.TB, jwksURL, runIssuer string, ttl time.Duration) *OIDCOP {
	addr := FreeAddr(t)
	o := &OIDCOP{URL: "http://" + addr + "/", ClientID: "sandgate", Secret: "sandgate-exchange-secret"}
	o.process = process{t: t, name: "oidc-op", bin: Tool(t, "oidc-op"), dir: t.TempDir(),
		args: []string{"-addr", addr, "-run-token-jwks", jwksURL, "-run-token-issuer", runIssuer,
			"-client-secret", o.Secret, "-access-token-ttl", ttl.String()}}
	o.Start()
	t.Cleanup(o.Stop)
	return o
}

// Start starts the OP (again): its tokens of before are forgotten.
func (o *OIDCOP) Start() {
	o.start(func() error { return get(o.URL + ".well-known/openid-configuration") })
}

// TokenURL and RevocationURL are the OP's endpoints.
func (o *OIDCOP) TokenURL() string      { return o.URL + "oauth/token" }
func (o *OIDCOP) RevocationURL() string { return o.URL + "revoke" }
