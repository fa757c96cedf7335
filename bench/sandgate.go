package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandgate/sandgate/proxy"
)

// sandboxAddr is the loopback source address of sandbox i: 127.10.0.1, 127.10.0.2, …
func sandboxAddr(i int) netip.Addr {
	base := uint32(127)<<24 | uint32(10)<<16 | 1
	v := base + uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

const benchAPIKey = "sk-bench-not-a-real-key-0123456789"

// benchData is the policy data: the shipped policies' rules, with the bench's template,
// provider host and tools; %s is the plain-HTTP upstream's port (the forward workload), which
// the shipped policy allows only when data lists it.
const benchData = `providers:
  anthropic:
    hosts: ["api.model.test"]
    credential: anthropic
templates:
  bench-agent:
    tools:
      - upstream: everything
        allow: ["echo"]
    hosts: ["127.0.0.50"]
    ports: {"127.0.0.50": [%s]}
    models:
      anthropic:
        allow: ["claude-bench"]
        max_tokens: 4096
`

// variant is a Sandgate measured beside "sandgate", same binary: the members it adds to the
// config's policy and audit sections.
type variant struct {
	name, policy, audit string
	omit                []string // top-level config keys left out (Options.BaselineOmit)
	// credentials, when set, replaces the config's credentials section.
	credentials string
}

// policyVariants are Options.PolicyVariants' targets.
var policyVariants = []variant{
	{name: "declog", policy: ", decision_log: {file: decisions/decisions.log}"},
	{name: "shadow", policy: ", shadow: {dir: policies}"},
}

// asyncDelivery is Options.DeliveryVariants' target: the audit log's async delivery, against
// "sandgate"'s blocking one (the default: an answer's end waits for its event's write).
var asyncDelivery = variant{name: "async", audit: "delivery: async, "}

// staticCredentials are "sandgate"'s: the model API key, from a file.
const staticCredentials = `credentials:
  - {name: anthropic, file: secrets/anthropic}
`

// mintedVariant is Options.CredentialVariants' target: the route's credential "anthropic"
// minted per sandbox run (OAuth 2.0 client credentials at the stand-ins' token endpoint, %s its
// URL) instead of read from a file: after a run's first call, what a minted credential costs
// per request (issue #57).
var mintedVariant = variant{name: "minted", credentials: `credentials:
  - {name: idp-secret, file: secrets/anthropic}
  - name: anthropic
    oauth2_client_credentials: {token_url: %q, client_id: bench, client_secret_credential: idp-secret}
`}

// exportVariant is Options.ExportVariants' target: the audit log exported over OTLP/HTTP to a
// Collector (%s: its URL).
var exportVariant = variant{name: "otlp", audit: "otlp: {endpoint: %q, insecure: true}, "}

// copyPolicies copies the shipped policies (not their tests) from policyDir into pol.
func copyPolicies(pol, policyDir string) error {
	regos, err := filepath.Glob(filepath.Join(policyDir, "*.rego"))
	if err != nil || len(regos) == 0 {
		return fmt.Errorf("sandgate files: no *.rego in %s", policyDir)
	}
	for _, f := range regos {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("sandgate files: %w", err)
		}
		if err := os.WriteFile(filepath.Join(pol, filepath.Base(f)), b, 0o600); err != nil {
			return fmt.Errorf("sandgate files: %w", err)
		}
	}
	return nil
}

// sandgateFiles writes Sandgate's bench config under dir: config, policies (the shipped *.rego
// of policyDir, without tests, plus benchData), interception CA, credential, audit folder.
// It returns the config path and the listener addresses.
func sandgateFiles(dir, policyDir string, up *Upstreams, sandboxes int, v variant) (cfgPath string, mcp, prx, admin string, err error) {
	pol := filepath.Join(dir, "policies")
	for _, d := range []string{pol, filepath.Join(dir, "audit"), filepath.Join(dir, "secrets")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", "", "", "", fmt.Errorf("sandgate files: %w", err)
		}
	}
	if err := copyPolicies(pol, policyDir); err != nil {
		return "", "", "", "", err
	}
	_, httpPort, _ := strings.Cut(up.HTTPAddr, ":")
	if err := os.WriteFile(filepath.Join(pol, "data.yaml"), []byte(fmt.Sprintf(benchData, httpPort)), 0o600); err != nil {
		return "", "", "", "", fmt.Errorf("sandgate files: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secrets", "anthropic"), []byte(benchAPIKey), 0o600); err != nil {
		return "", "", "", "", fmt.Errorf("sandgate files: %w", err)
	}
	caCert, caKey, err := proxy.InitCA(filepath.Join(dir, "ca"), true, time.Now())
	if err != nil {
		return "", "", "", "", fmt.Errorf("sandgate CA: %w", err)
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return "", "", "", "", err
		}
	}
	mcp = fmt.Sprintf("127.0.0.1:%d", ports[0])
	prx = fmt.Sprintf("127.0.0.1:%d", ports[1])
	admin = fmt.Sprintf("127.0.0.1:%d", ports[2])
	_, tlsPort, _ := strings.Cut(up.TLSAddr, ":")
	var b strings.Builder
	fmt.Fprintf(&b, `# Generated by the bench (bench/sandgate.go); every address is loopback.
listen: {mcp: %q, proxy: %q, admin: %q}
admin: {pprof: true}
policy: {dir: policies, watch: false%s}
audit: {%sfile: {dir: audit, max_size_mb: 512, fsync: batch}}
shutdown: {delay: 0s}
%sgateway:
  allowed_hosts: [sandgate]
  session_idle_timeout: 30m
  upstreams:
    - {name: everything, url: %q, prefix: never}
proxy:
  ca: {cert: %q, key: %q}
  resolve_overrides: {%q: %q}
  routes:
    - {name: anthropic, upstream: "https://%s:%s", api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
  hosts:
    - {host: %q, port: %s, mode: intercept, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
    - {host: %q, port: %s, mode: tunnel, allow_private: true}
  limits: {tunnels_per_sandbox: 1024}
log: {level: warn, format: text}
identity:
  static:
`, mcp, prx, admin, v.policy, v.audit, credentialsOf(v), up.MCPURL, caCert, caKey, modelHost, upstreamIP, modelHost, tlsPort, modelHost, tlsPort, upstreamIP, tlsPort)
	for i := range sandboxes {
		fmt.Fprintf(&b, "    - {addresses: [%q], namespace: bench, sandbox: sb-%d, template: bench-agent}\n", sandboxAddr(i), i)
	}
	cfgPath = filepath.Join(dir, "sandgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(omitKeys(b.String(), v.omit)), 0o600); err != nil {
		return "", "", "", "", fmt.Errorf("sandgate config: %w", err)
	}
	return cfgPath, mcp, prx, admin, nil
}

func credentialsOf(v variant) string {
	if v.credentials != "" {
		return v.credentials
	}
	return staticCredentials
}

// startSandgate starts `sandgate serve` with the bench config and waits until /readyz is 200.
// SSL_CERT_FILE makes the stand-in's CA the upstream trust roots of that process only.
// name is the target's name: "sandgate", or "baseline" for the A/B binary (Options.BaselineBin).
func startSandgate(ctx context.Context, name, bin, dir, policyDir string, up *Upstreams, sandboxes int, v variant) (*Target, error) {
	cfg, mcp, prx, admin, err := sandgateFiles(dir, policyDir, up, sandboxes, v)
	if err != nil {
		return nil, err
	}
	env := []string{"SSL_CERT_FILE=" + up.CAPath}
	p, err := startProcess(name, dir, env, bin, "serve", "--config", cfg)
	if err != nil {
		return nil, err
	}
	if err := p.waitHTTP(ctx, "http://"+admin+"/readyz", 60*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	roots, err := os.ReadFile(filepath.Join(dir, "ca", proxy.CACertFile))
	if err != nil {
		p.Stop(5 * time.Second)
		return nil, fmt.Errorf("read sandgate CA: %w", err)
	}
	return &Target{Name: name, Proxy: prx, MCPURL: "http://" + mcp + "/mcp",
		RouteURL: "http://" + prx + "/routes/anthropic", Admin: admin, InterceptCA: roots, proc: p}, nil
}

// omitKeys returns the YAML document cfg without the top-level keys named in keys, each with
// the lines indented under it: a baseline binary older than a config field refuses a config
// that sets it (Options.BaselineOmit).
func omitKeys(cfg string, keys []string) string {
	if len(keys) == 0 {
		return cfg
	}
	var b strings.Builder
	skipping := false
	for _, line := range strings.SplitAfter(cfg, "\n") {
		if line != "" && line[0] != ' ' && line[0] != '\t' && line[0] != '\n' {
			key, _, _ := strings.Cut(line, ":")
			skipping = slices.Contains(keys, key)
		}
		if !skipping {
			b.WriteString(line)
		}
	}
	return b.String()
}
