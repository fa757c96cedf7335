package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Proxy configures the egress side: the forward proxy and base-URL routes on listen.proxy.
//
// Credential choice: a route or host names the one credential that may be injected for it
// (name, header, format). The policy may confirm it by returning the same name in its
// decision's "credential"; a policy that names a different credential is a deny, because a
// policy must never be able to send one provider's key to another provider's host. A policy
// that names none leaves the configured credential in place.
type Proxy struct {
	// CA is the certificate authority that signs the leaf certificates of intercepted hosts.
	// `sandgate ca init --dir DIR` writes ca.crt and ca.key. Needed when a host is intercepted.
	CA ProxyCA `json:"ca"`
	// Routes are the base-URL routes: /routes/NAME/rest is forwarded to Upstream + /rest.
	Routes []ProxyRoute `json:"routes"`
	// Hosts are the hosts a sandbox may CONNECT to and how each is handled. A CONNECT to any
	// other host is refused.
	Hosts []ProxyHost `json:"hosts"`
	// DeniedCIDRs are extra destination ranges the dial guard refuses (the pod and service
	// CIDRs of the cluster), on top of every IANA special-purpose block (loopback, private,
	// link-local, metadata, CGNAT, …). A route's allow_private lifts them.
	DeniedCIDRs []string `json:"denied_cidrs"`
	// AllowedCIDRs are special-purpose ranges the dial guard may dial after all, for every
	// destination a sandbox can name: typically the NAT64 prefix of an IPv6-only cluster
	// (64:ff9b::/96). An entry opens only the registry block it lies inside; the IPv4 address a
	// translation prefix carries is still checked, and metadata, unspecified, multicast and
	// broadcast addresses stay refused. See docs/egress-proxy.md, "Dial guard".
	AllowedCIDRs []string    `json:"allowed_cidrs"`
	Limits       ProxyLimits `json:"limits"`
	// ResolveOverrides answers the dial guard's name lookups from this map (host name → IP
	// address) instead of DNS. It is for tests and the benchmark (bench/), which give local
	// stand-ins fake public names; the answers still pass every dial guard check.
	ResolveOverrides map[string]string `json:"resolve_overrides"`
	// ConnectTo dials a destination at another address, like curl's --connect-to: "host:port"
	// → "ip:port". The name is still what policy decides on, what TLS verifies and what the
	// Host header says; only the dial changes. The operator named the address, so loopback and
	// private addresses may be dialed (as with allow_private); metadata, unspecified, multicast
	// and broadcast addresses stay refused. `make run` points api.anthropic.com:443 at the local
	// stand-in model API (examples/model-api) this way.
	ConnectTo map[string]string `json:"connect_to"`
}

// ProxyCA names the CA files. Relative paths are resolved against the config file's folder.
type ProxyCA struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// API kinds: what the proxy parses in request and response bodies.
const (
	APIAnthropic = "anthropic"
	APIOpenAI    = "openai"
	APINone      = "none"
)

// ProxyRoute is one base-URL route.
type ProxyRoute struct {
	// Name is the path segment after /routes/ and input.http.route in policy.
	Name string `json:"name"`
	// Upstream is the base URL requests are forwarded to (https://api.anthropic.com).
	Upstream string `json:"upstream"`
	// API is anthropic, openai or none (default none): which model API the bodies speak.
	API        string         `json:"api"`
	Credential *CredentialRef `json:"credential"`
	// AllowPrivate lets the dial guard reach the upstream at a loopback, private or link-local
	// address (an in-cluster model server). Metadata addresses stay denied.
	AllowPrivate bool `json:"allow_private"`
}

// ProxyHost is one host a sandbox may CONNECT to.
type ProxyHost struct {
	Host string `json:"host"`
	// Port defaults to 443.
	Port int `json:"port"`
	// Mode is intercept (TLS terminated with Sandgate's CA, each request decided and a
	// credential injected) or tunnel (bytes relayed after the dial guard).
	Mode         string         `json:"mode"`
	API          string         `json:"api"`
	Credential   *CredentialRef `json:"credential"`
	AllowPrivate bool           `json:"allow_private"`
}

// Host modes.
const (
	ModeIntercept = "intercept"
	ModeTunnel    = "tunnel"
)

// ProxyLimits bounds what a sandbox can make the proxy hold.
type ProxyLimits struct {
	// BodyBytes is the largest model-API request body the proxy reads to find model and
	// max_tokens (default 4 MiB). A larger body to a model endpoint is refused with 413.
	BodyBytes int64 `json:"body_bytes"`
	// MaxHeaderBytes bounds a request head (default 32 KiB); a larger one is refused with 431.
	MaxHeaderBytes int `json:"max_header_bytes"`
	// TunnelsPerSandbox caps concurrent CONNECT tunnels of one sandbox (default 64).
	TunnelsPerSandbox int `json:"tunnels_per_sandbox"`
	// DialTimeout bounds resolving and connecting to an upstream (default 10s).
	DialTimeout Duration `json:"dial_timeout"`
	// TLSHandshakeTimeout bounds the TLS handshake with an upstream (default 10s).
	TLSHandshakeTimeout Duration `json:"tls_handshake_timeout"`
	// ResponseHeaderTimeout bounds the wait for an upstream's response head (default 5m:
	// model responses can take long before the first byte).
	ResponseHeaderTimeout Duration `json:"response_header_timeout"`
	// IdleConnTimeout closes pooled upstream connections idle this long (default 90s).
	IdleConnTimeout Duration `json:"idle_conn_timeout"`
	// ClientHandshakeTimeout bounds the time from CONNECT to a finished TLS handshake with the
	// sandbox (intercept) and the time a client may take to send a request head (default 10s).
	ClientHandshakeTimeout Duration `json:"client_handshake_timeout"`
	// BodyTimeout bounds the time a sandbox takes to send a request body (default 30s), plus
	// one second for every MinBodyRate bytes (default 16384): a trickled body is cut with 408.
	BodyTimeout Duration `json:"body_timeout"`
	MinBodyRate int64    `json:"min_body_rate"`
	// TunnelIdleTimeout closes a tunnel with no bytes in either direction this long (default 2m).
	TunnelIdleTimeout Duration `json:"tunnel_idle_timeout"`
}

func (x *Proxy) applyDefaults(c *Config) {
	if x.CA.Cert != "" {
		x.CA.Cert = c.Path(x.CA.Cert)
	}
	if x.CA.Key != "" {
		x.CA.Key = c.Path(x.CA.Key)
	}
	for i := range x.Routes {
		r := &x.Routes[i]
		if r.API == "" {
			r.API = APINone
		}
		r.Credential.applyDefaults()
	}
	for i := range x.Hosts {
		h := &x.Hosts[i]
		if h.Port == 0 {
			h.Port = 443
		}
		if h.API == "" {
			h.API = APINone
		}
		h.Host = strings.ToLower(strings.TrimSuffix(h.Host, "."))
		h.Credential.applyDefaults()
	}
	l := &x.Limits
	proxyDefault(&l.BodyBytes, 4<<20)
	proxyDefault(&l.MaxHeaderBytes, 32<<10)
	proxyDefault(&l.BodyTimeout, Duration(30*time.Second))
	proxyDefault(&l.MinBodyRate, 16<<10)
	proxyDefault(&l.TunnelsPerSandbox, 64)
	proxyDefault(&l.DialTimeout, Duration(10*time.Second))
	proxyDefault(&l.TLSHandshakeTimeout, Duration(10*time.Second))
	proxyDefault(&l.ResponseHeaderTimeout, Duration(5*time.Minute))
	proxyDefault(&l.IdleConnTimeout, Duration(90*time.Second))
	proxyDefault(&l.ClientHandshakeTimeout, Duration(10*time.Second))
	proxyDefault(&l.TunnelIdleTimeout, Duration(2*time.Minute))
}

func proxyDefault[T int | int64 | Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

func (x *Proxy) validate(c *Config, errs *fieldErrors) {
	x.validateRoutes(c, errs)
	x.validateHosts(c, errs)
	for i, s := range x.DeniedCIDRs {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs.add(fmt.Sprintf("proxy.denied_cidrs[%d]", i), "%q is not a CIDR prefix such as 10.96.0.0/12", s)
		}
	}
	for i, s := range x.AllowedCIDRs {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs.add(fmt.Sprintf("proxy.allowed_cidrs[%d]", i), "%q is not a CIDR prefix such as 64:ff9b::/96", s)
		}
	}
	for name, ip := range x.ResolveOverrides {
		f := fmt.Sprintf("proxy.resolve_overrides[%q]", name)
		if _, err := netip.ParseAddr(name); err == nil || name == "" || strings.ContainsAny(name, "/ @*[]:") {
			errs.add(f, "%q is not a host name", name)
		}
		if _, err := netip.ParseAddr(ip); err != nil {
			errs.add(f, "%q is not an IP address", ip)
		}
	}
	for dest, addr := range x.ConnectTo {
		f := fmt.Sprintf("proxy.connect_to[%q]", dest)
		host, port, err := net.SplitHostPort(dest)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || strings.ContainsAny(host, "/ @*[]") || perr != nil || n < 1 || n > 65535 {
			errs.add(f, "%q is not host:port (api.anthropic.com:443)", dest)
		}
		if _, err := netip.ParseAddrPort(addr); err != nil {
			errs.add(f, "%q is not ip:port (127.0.0.1:8443)", addr)
		}
	}
	if (x.CA.Cert == "") != (x.CA.Key == "") {
		errs.add("proxy.ca", "set both cert and key, or neither")
	}
	l := x.Limits
	if l.BodyBytes < 1024 {
		errs.add("proxy.limits.body_bytes", "must be at least 1024, got %d", l.BodyBytes)
	}
	if l.MaxHeaderBytes < 1024 {
		errs.add("proxy.limits.max_header_bytes", "must be at least 1024, got %d", l.MaxHeaderBytes)
	}
	if l.TunnelsPerSandbox < 1 {
		errs.add("proxy.limits.tunnels_per_sandbox", "must be at least 1, got %d", l.TunnelsPerSandbox)
	}
}

func (x *Proxy) validateRoutes(c *Config, errs *fieldErrors) {
	routes := map[string]int{}
	for i, r := range x.Routes {
		f := fmt.Sprintf("proxy.routes[%d]", i)
		switch {
		case r.Name == "":
			errs.add(f+".name", "must not be empty")
		case !validName(r.Name):
			errs.add(f+".name", "%q may contain only letters, digits, '-', '_' and '.'", r.Name)
		}
		errs.unique(routes, "proxy.routes", i, r.Name)
		u, err := url.Parse(r.Upstream)
		switch {
		case r.Upstream == "":
			errs.add(f+".upstream", "must not be empty (a base URL such as https://api.anthropic.com)")
		case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
			errs.add(f+".upstream", "%q is not an http(s) base URL without user info, query or fragment", r.Upstream)
		}
		proxyValidateAPI(f+".api", r.API, errs)
		r.Credential.validate(c, f+".credential", errs)
		if r.Credential != nil && err == nil && u.Scheme == "http" && !r.AllowPrivate {
			errs.add(f+".credential", "a credential is sent only over https; use an https upstream (or allow_private for an in-cluster http upstream)")
		}
	}
}

func (x *Proxy) validateHosts(c *Config, errs *fieldErrors) {
	hosts := map[string]int{}
	for i, h := range x.Hosts {
		f := fmt.Sprintf("proxy.hosts[%d]", i)
		if _, ipErr := netip.ParseAddr(h.Host); h.Host == "" || strings.ContainsAny(h.Host, "/ @*[]") || (strings.Contains(h.Host, ":") && ipErr != nil) {
			errs.add(f+".host", "%q is not a host name or IP address (give the port in port)", h.Host)
		}
		if h.Port < 1 || h.Port > 65535 {
			errs.add(f+".port", "%d is not a port between 1 and 65535", h.Port)
		}
		key := net.JoinHostPort(h.Host, fmt.Sprint(h.Port))
		if j, dup := hosts[key]; dup {
			errs.add(f+".host", "%s is already defined by proxy.hosts[%d]", key, j)
		}
		hosts[key] = i
		switch h.Mode {
		case ModeIntercept:
			if x.CA.Cert == "" || x.CA.Key == "" {
				errs.add(f+".mode", "intercept needs proxy.ca.cert and proxy.ca.key (create them with `sandgate ca init --dir DIR`)")
			}
		case ModeTunnel:
			if h.Credential != nil {
				errs.add(f+".credential", "a tunnel relays encrypted bytes and cannot inject a credential; use mode intercept")
			}
		default:
			errs.add(f+".mode", "%q is not one of intercept, tunnel", h.Mode)
		}
		proxyValidateAPI(f+".api", h.API, errs)
		h.Credential.validate(c, f+".credential", errs)
	}
}

func proxyValidateAPI(field, api string, errs *fieldErrors) {
	switch api {
	case APIAnthropic, APIOpenAI, APINone:
	default:
		errs.add(field, "%q is not one of anthropic, openai, none", api)
	}
}
