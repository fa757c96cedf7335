package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Gateway configures the MCP side: the /mcp endpoint sandboxes talk to and the upstream MCP
// servers behind it.
//
//	gateway:
//	  allowed_hosts: [sandgate, sandgate.sandgate.svc]
//	  allowed_origins: []
//	  max_body_bytes: 4194304
//	  session_idle_timeout: 30m
//	  upstreams:
//	  - name: github
//	    url: https://api.githubcopilot.com/mcp/
//	    prefix: always
//	    credential: {name: github, header: Authorization, format: "Bearer {value}"}
//	  - name: everything
//	    command: bin/mcp-upstream
//	    env: {LOG_LEVEL: info}
//	    credential_env: {API_TOKEN: some-credential}
type Gateway struct {
	// AllowedHosts are the Host header values (without port) /mcp accepts, in addition to
	// localhost, 127.0.0.1 and ::1. Any other Host is refused with 403 (DNS-rebinding
	// protection). Default: [sandgate].
	AllowedHosts []string `json:"allowed_hosts"`
	// AllowedOrigins are the Origin header values ("scheme://host[:port]") accepted. A request
	// without Origin is accepted; an Origin whose host is localhost or an allowed host is
	// accepted; any other Origin is refused with 403.
	AllowedOrigins []string `json:"allowed_origins"`
	// MaxBodyBytes bounds one POST body; larger bodies get 413 and a JSON-RPC error.
	// Default 4 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes"`
	// SessionIdleTimeout ends a sandbox session (and its upstream sessions) after this long
	// without a request. Default 30m.
	SessionIdleTimeout Duration `json:"session_idle_timeout"`
	// BodyTimeout bounds the time a sandbox takes to send a request body (default 30s), plus
	// one second for every MinBodyRate bytes (default 16384): a trickled body is cut with 408.
	BodyTimeout Duration `json:"body_timeout"`
	MinBodyRate int64    `json:"min_body_rate"`
	// MaxSessionsPerSandbox caps the live MCP sessions one sandbox (source address) holds on a
	// replica (default 64); an initialize over it is refused with 429 and audited.
	MaxSessionsPerSandbox int `json:"max_sessions_per_sandbox"`
	// MaxSessions caps the live MCP sessions of a replica (default 50000).
	MaxSessions int `json:"max_sessions"`
	// Upstreams are the MCP servers whose tools, resources and prompts are aggregated.
	Upstreams []Upstream `json:"upstreams"`
	// Unpinned is what sandboxes see of an upstream tool that has no pin in the policy
	// folder's pins file (tool-pins.yaml, written by `sandgate policy pin`): allow (the
	// default, so that a config without pins keeps working) or hide. A pinned tool whose
	// definition changed is hidden either way (docs/policies.md, "Pin tool definitions").
	Unpinned string `json:"unpinned"`
}

// gateway.unpinned values (internal/pins.UnpinnedAllow, UnpinnedHide).
const (
	UnpinnedAllow = "allow"
	UnpinnedHide  = "hide"
)

// Prefix modes of an upstream's tool and prompt names.
const (
	PrefixAlways     = "always"      // always "<upstream>_<tool>"
	PrefixNever      = "never"       // the upstream's name; a name two upstreams offer is neither's
	PrefixOnConflict = "on-conflict" // the upstream's name unless another upstream has it too
)

// Upstream is one MCP server. Exactly one of URL (Streamable HTTP) and Command (stdio, started
// and supervised by Sandgate) is set.
type Upstream struct {
	// Name identifies the upstream in policy (input.mcp.upstream), audit and prefixes.
	Name string `json:"name"`
	// URL is the Streamable HTTP endpoint, http or https.
	URL string `json:"url"`
	// Command and Args start a stdio server; Env adds variables to its environment (Sandgate's
	// own environment is not inherited beyond PATH and HOME).
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	// Prefix is always, never or on-conflict (default).
	Prefix string `json:"prefix"`
	// Credential is injected into every HTTP request to the upstream.
	Credential *CredentialRef `json:"credential"`
	// CredentialEnv maps environment variable names of a stdio server to credential names.
	CredentialEnv map[string]string `json:"credential_env"`
	// CallTimeout bounds one forwarded request. Default 60s.
	CallTimeout Duration `json:"call_timeout"`
	// ConnectTimeout bounds connecting and initializing. Default 10s.
	ConnectTimeout Duration `json:"connect_timeout"`
	// ProtocolVersion pins the MCP revision spoken to the upstream, for an upstream that
	// mishandles negotiation. Empty (the default) negotiates the newest both sides speak; a
	// revision before 2026-07-28 keeps the initialize handshake and its session.
	ProtocolVersion string `json:"protocol_version"`
	// Sessions is per-sandbox (the default) or shared. per-sandbox gives every sandbox session
	// its own upstream session on a stateful (pre-2026-07-28) upstream, so that log messages,
	// subscriptions, sampling and elicitation of one sandbox never meet another's; on a stdio
	// upstream that session is a process of its own. shared sends every sandbox's requests on
	// one upstream session (one process). A 2026-07-28 upstream keeps no session state and
	// shares one connection.
	Sessions string `json:"sessions"`
	// MaxSessions bounds the per-sandbox sessions open to this upstream (default 256 for url,
	// 32 for command, where each is a process): at the limit the least recently used idle one
	// is closed; when none is idle, calls use the shared session. Sessions idle for
	// gateway.session_idle_timeout are closed.
	MaxSessions int `json:"max_sessions"`
	// MaxResponseBytes bounds the response to one forwarded request, every message of an event
	// stream included (default 64 MiB); MaxMessageBytes bounds one JSON-RPC message: a JSON
	// body, one event of a stream, one line of a stdio server (default 16 MiB). A response over
	// either fails its call with upstream_too_large; a stdio server over MaxMessageBytes is
	// restarted. Long-lived streams (list changes) are bounded per message only.
	MaxResponseBytes int64 `json:"max_response_bytes"`
	MaxMessageBytes  int64 `json:"max_message_bytes"`
	// MaxNotificationRate caps the notifications one upstream session may send per second
	// (burst: one second's worth; default 1000). The excess is dropped and counted in
	// sandgate_gateway_notifications_dropped_total, never queued.
	MaxNotificationRate float64 `json:"max_notification_rate"`
	// Breaker isolates the upstream when its transport fails: after Failures consecutive
	// transport failures or timeouts of calls, its calls answer upstream_unavailable at once
	// for OpenFor, then one probe call decides. An error the upstream answers never counts.
	Breaker UpstreamBreaker `json:"breaker"`
}

// UpstreamBreaker is an upstream's circuit breaker (defaults: 5 failures, open for 10s).
type UpstreamBreaker struct {
	Failures int      `json:"failures"`
	OpenFor  Duration `json:"open_for"`
}

// Upstream session models.
const (
	SessionsPerSandbox = "per-sandbox"
	SessionsShared     = "shared"
)

// Default bounds on per-sandbox upstream sessions: an HTTP session costs the upstream some
// memory; a stdio one is a whole process (tens of MB for a Node or Python server).
const (
	defaultMaxSessions      = 256
	defaultMaxStdioSessions = 32
)

// Defaults of an upstream's bounds.
const (
	DefaultMaxResponseBytes    = 64 << 20
	DefaultMaxMessageBytes     = 16 << 20
	DefaultMaxNotificationRate = 1000
)

// ApplyBounds fills in the bounds left zero with their defaults.
func (u *Upstream) ApplyBounds() {
	if u.MaxResponseBytes == 0 {
		u.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if u.MaxMessageBytes == 0 {
		u.MaxMessageBytes = min(DefaultMaxMessageBytes, u.MaxResponseBytes)
	}
	if u.MaxNotificationRate == 0 {
		u.MaxNotificationRate = DefaultMaxNotificationRate
	}
}

// IsStdio reports whether the upstream is a command Sandgate starts.
func (u Upstream) IsStdio() bool { return u.Command != "" }

func (x *Gateway) applyDefaults(c *Config) {
	if x.AllowedHosts == nil {
		x.AllowedHosts = []string{"sandgate"}
	}
	if x.MaxBodyBytes == 0 {
		x.MaxBodyBytes = 4 << 20
	}
	if x.MaxSessionsPerSandbox == 0 {
		x.MaxSessionsPerSandbox = 64
	}
	if x.BodyTimeout == 0 {
		x.BodyTimeout = Duration(30 * time.Second)
	}
	if x.MinBodyRate == 0 {
		x.MinBodyRate = 16 << 10
	}
	if x.MaxSessions == 0 {
		x.MaxSessions = 50000
	}
	if x.SessionIdleTimeout == 0 {
		x.SessionIdleTimeout = Duration(30 * time.Minute)
	}
	if x.Unpinned == "" {
		x.Unpinned = UnpinnedAllow
	}
	for i := range x.Upstreams {
		u := &x.Upstreams[i]
		if u.Prefix == "" {
			u.Prefix = PrefixOnConflict
		}
		if u.CallTimeout == 0 {
			u.CallTimeout = Duration(60 * time.Second)
		}
		if u.ConnectTimeout == 0 {
			u.ConnectTimeout = Duration(10 * time.Second)
		}
		if u.Sessions == "" {
			u.Sessions = SessionsPerSandbox
		}
		if u.MaxSessions == 0 {
			u.MaxSessions = defaultMaxSessions
			if u.IsStdio() {
				u.MaxSessions = defaultMaxStdioSessions
			}
		}
		u.ApplyBounds()
		if u.Breaker.Failures == 0 {
			u.Breaker.Failures = 5
		}
		if u.Breaker.OpenFor == 0 {
			u.Breaker.OpenFor = Duration(10 * time.Second)
		}
		u.Credential.applyDefaults()
		if u.Command != "" && strings.ContainsRune(u.Command, '/') {
			u.Command = c.Path(u.Command)
		}
	}
}

func (x *Gateway) validate(c *Config, errs *fieldErrors) {
	if x.MaxSessionsPerSandbox < 0 {
		errs.add("gateway.max_sessions_per_sandbox", "must not be negative, got %d", x.MaxSessionsPerSandbox)
	}
	if x.MaxSessions < 0 {
		errs.add("gateway.max_sessions", "must not be negative, got %d", x.MaxSessions)
	}
	if x.MaxBodyBytes < 1024 {
		errs.add("gateway.max_body_bytes", "must be at least 1024, got %d", x.MaxBodyBytes)
	}
	if x.SessionIdleTimeout.D() < time.Second {
		errs.add("gateway.session_idle_timeout", "must be at least 1s, got %s", x.SessionIdleTimeout.D())
	}
	switch x.Unpinned {
	case UnpinnedAllow:
	case UnpinnedHide:
		if c.Policy.Bundle.Configured() {
			errs.add("gateway.unpinned", "hide needs the pins file of policy.dir (tool-pins.yaml), and policy.bundle serves no folder: use allow, or serve policy.dir")
		}
	default:
		errs.add("gateway.unpinned", "%q is not allow or hide", x.Unpinned)
	}
	for i, h := range x.AllowedHosts {
		if h == "" || strings.ContainsAny(h, "/ :") && !strings.HasPrefix(h, "[") {
			errs.add(fmt.Sprintf("gateway.allowed_hosts[%d]", i), "%q is not a host name (no scheme, port or path)", h)
		}
	}
	for i, o := range x.AllowedOrigins {
		u, err := url.Parse(o)
		if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			errs.add(fmt.Sprintf("gateway.allowed_origins[%d]", i), "%q is not an origin such as https://app.example.com", o)
		}
	}
	names := map[string]int{}
	for i, u := range x.Upstreams {
		f := fmt.Sprintf("gateway.upstreams[%d]", i)
		switch {
		case u.Name == "":
			errs.add(f+".name", "must not be empty")
		case !validUpstreamName(u.Name):
			errs.add(f+".name", "%q may contain only letters, digits, '-' and '_' (it becomes a tool-name prefix)", u.Name)
		case len(u.Name) > 32:
			errs.add(f+".name", "%q is longer than 32 characters (it becomes a tool-name prefix)", u.Name)
		}
		errs.unique(names, "gateway.upstreams", i, u.Name)
		u.validate(c, f, errs)
	}
}

// validate checks one upstream's fields other than its name; f names it in errors.
func (u Upstream) validate(c *Config, f string, errs *fieldErrors) {
	if (u.URL == "") == (u.Command == "") {
		errs.add(f, "set exactly one of url (Streamable HTTP) or command (stdio)")
	}
	if u.URL != "" {
		pu, err := url.Parse(u.URL)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			errs.add(f+".url", "%q is not an http(s) URL", u.URL)
		} else if pu.User != nil {
			errs.add(f+".url", "must not carry user info; use credential instead")
		}
		if len(u.Args) > 0 || len(u.Env) > 0 || len(u.CredentialEnv) > 0 {
			errs.add(f, "args, env and credential_env apply to stdio upstreams (command) only")
		}
	}
	if u.Command != "" && u.Credential != nil {
		errs.add(f+".credential", "applies to HTTP upstreams only; use credential_env for a command")
	}
	switch u.Prefix {
	case PrefixAlways, PrefixNever, PrefixOnConflict:
	default:
		errs.add(f+".prefix", "%q is not one of always, never, on-conflict", u.Prefix)
	}
	switch u.Sessions {
	case SessionsPerSandbox, SessionsShared:
	default:
		errs.add(f+".sessions", "%q is not one of per-sandbox, shared", u.Sessions)
	}
	if u.MaxSessions < 0 {
		errs.add(f+".max_sessions", "must not be negative, got %d", u.MaxSessions)
	}
	u.Credential.validate(c, f+".credential", errs)
	for env, cred := range u.CredentialEnv {
		if !c.HasCredential(cred) {
			errs.add(f+".credential_env."+env, "no credential named %q in credentials", cred)
		}
	}
	if u.MaxMessageBytes < 1024 {
		errs.add(f+".max_message_bytes", "must be at least 1024, got %d", u.MaxMessageBytes)
	}
	if u.MaxResponseBytes < u.MaxMessageBytes {
		errs.add(f+".max_response_bytes", "must be at least max_message_bytes (%d), got %d", u.MaxMessageBytes, u.MaxResponseBytes)
	}
	if u.MaxNotificationRate < 0 {
		errs.add(f+".max_notification_rate", "must not be negative, got %g", u.MaxNotificationRate)
	}
	if u.Breaker.Failures < 0 {
		errs.add(f+".breaker.failures", "must not be negative, got %d", u.Breaker.Failures)
	}
	if u.Breaker.OpenFor.D() < 0 {
		errs.add(f+".breaker.open_for", "must not be negative, got %s", u.Breaker.OpenFor.D())
	}
	if u.CallTimeout.D() < 10*time.Millisecond {
		errs.add(f+".call_timeout", "must be at least 10ms")
	}
	if u.ConnectTimeout.D() < 10*time.Millisecond {
		errs.add(f+".connect_timeout", "must be at least 10ms")
	}
}

func validUpstreamName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return s != ""
}
