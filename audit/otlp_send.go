package audit

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	collogpb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

const (
	otlpUserAgent = "sandgate audit otlp exporter"
	// otlpExportMethod is LogsService.Export (opentelemetry/proto/collector/logs/v1).
	otlpExportMethod = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
	// otlpMaxRequest is the SDK exporters' limit on a request before compression.
	otlpMaxRequest = 64 << 20
	// otlpMaxResponse bounds what is read of a response: an ExportLogsServiceResponse is a few
	// bytes, and an error page is only quoted in the error.
	otlpMaxResponse    = 64 << 10
	otlpDefaultTimeout = 10 * time.Second
)

// otlpSender sends encoded ExportLogsServiceRequest messages to a Collector over OTLP/HTTP
// (protobuf) or OTLP/gRPC. It sends each request once (the caller retries, from its file) and
// reports as an error anything but an acknowledgement of every record: a status other than 2xx
// or OK, a partial success, a response it cannot read. A redirect is not followed: a POST
// turned into a GET would be "acknowledged" with nothing delivered, and the auth header would go
// to the new location. The body is the caller's again when send returns.
type otlpSender struct {
	timeout time.Duration // 0: none of its own (OTEL_EXPORTER_OTLP_TIMEOUT=0)
	gzip    bool
	auth    AuthHeader

	// OTLP/HTTP
	url    string
	header http.Header // User-Agent, the configured headers, Content-Type: in the SDK's order
	client *http.Client
	gzips  sync.Pool // *gzipBuffer

	// OTLP/gRPC
	conn *grpc.ClientConn
	md   metadata.MD
}

// newOTLPSender resolves cfg against the standard variables (getenv; nil means os.Getenv) as the
// OpenTelemetry exporters do, and returns a sender. Nothing is dialled here.
//
// Unlike the exporters, which log a variable they cannot parse and carry on without it, a
// variable that does not parse (or names a certificate that does not load) is an error that
// names it. And an auth header is never sent in plain text unless cfg.Insecure says so: an
// http:// endpoint from the environment is refused then, as the config refuses one of its own.
func newOTLPSender(cfg OTLPConfig, getenv func(string) string) (*otlpSender, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	protocol := cfg.Protocol
	if protocol == "" {
		protocol = OTLPProtocolHTTP
	}
	if protocol != OTLPProtocolHTTP && protocol != OTLPProtocolGRPC {
		return nil, fmt.Errorf("audit otlp exporter: protocol %q is not %s or %s", cfg.Protocol, OTLPProtocolGRPC, OTLPProtocolHTTP)
	}
	t, err := resolveOTLPTarget(cfg, protocol == OTLPProtocolGRPC, otlpEnv(getenv))
	if err != nil {
		return nil, fmt.Errorf("audit otlp exporter (%s): %w", protocol, err)
	}
	s := &otlpSender{timeout: t.timeout, gzip: t.gzip, auth: cfg.Auth}
	if protocol == OTLPProtocolGRPC {
		err = s.initGRPC(t, cfg)
	} else {
		err = s.initHTTP(t)
	}
	if err != nil {
		return nil, fmt.Errorf("audit otlp exporter (%s): %w", protocol, err)
	}
	return s, nil
}

func (s *otlpSender) initHTTP(t otlpTarget) error {
	if t.insecure && t.tls != nil {
		return errors.New("an insecure (http://) endpoint cannot use a TLS configuration (the config's, or the OTEL_EXPORTER_OTLP_*CERTIFICATE variables')")
	}
	// The exporter's transport: Go's default as a copy, not http.DefaultTransport itself, which
	// another package may have replaced.
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		TLSClientConfig:       t.tls,
	}
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	s.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	s.url = t.endpoint
	s.header = http.Header{}
	s.header.Set("User-Agent", otlpUserAgent)
	for k, v := range t.headers {
		s.header.Set(k, v)
	}
	s.header.Set("Content-Type", "application/x-protobuf")
	s.gzips.New = func() any { return &gzipBuffer{w: gzip.NewWriter(io.Discard)} }
	return nil
}

func (s *otlpSender) initGRPC(t otlpTarget, cfg OTLPConfig) error {
	// The exporter's order: a TLS configuration wins over insecure.
	creds := insecure.NewCredentials()
	switch {
	case t.tls != nil:
		creds = credentials.NewTLS(t.tls)
	case !t.insecure:
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	calls := []grpc.CallOption{grpc.ForceCodecV2(preEncodedCodec{})}
	if t.gzip {
		calls = append(calls, grpc.UseCompressor(grpcgzip.Name))
	}
	opts := []grpc.DialOption{grpc.WithUserAgent(otlpUserAgent), grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(calls...)}
	if cfg.Auth != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(rpcAuth{auth: cfg.Auth, insecure: cfg.Insecure}))
	}
	conn, err := grpc.NewClient(t.endpoint, opts...)
	if err != nil {
		return fmt.Errorf("client for %s: %w", t.endpoint, err)
	}
	s.conn = conn
	if len(t.headers) > 0 {
		s.md = metadata.New(t.headers)
	}
	return nil
}

// send posts one request body (a serialized ExportLogsServiceRequest) and returns nil only when
// the Collector acknowledged it. ctx bounds it; send also applies the resolved timeout.
func (s *otlpSender) send(ctx context.Context, body []byte) error {
	if len(body) > otlpMaxRequest {
		return fmt.Errorf("request of %d bytes is over the limit of %d", len(body), otlpMaxRequest)
	}
	if s.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	if s.conn != nil {
		return s.export(ctx, body)
	}
	return s.post(ctx, body)
}

func (s *otlpSender) post(ctx context.Context, body []byte) error {
	payload := body
	if s.gzip {
		z := s.gzips.Get().(*gzipBuffer)
		defer s.gzips.Put(z) // after the gate below is closed: the transport is done with it
		var err error
		if payload, err = z.compress(body); err != nil {
			return fmt.Errorf("gzip request: %w", err)
		}
	}
	gate := &bodyGate{b: payload}
	defer gate.close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, nil)
	if err != nil {
		return err
	}
	// GetBody lets the transport send again on a kept-alive connection the Collector had closed.
	req.Body, req.ContentLength = gate.open(), int64(len(payload))
	req.GetBody = func() (io.ReadCloser, error) { return gate.open(), nil }
	req.Header = s.header.Clone()
	if s.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	if s.auth != nil {
		if name, value := s.auth(); name != "" {
			req.Header.Set(name, value)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() // unread beyond the bound: the connection is dropped, not drained
	data, err := io.ReadAll(io.LimitReader(resp.Body, otlpMaxResponse+1))
	over := len(data) > otlpMaxResponse
	if over {
		data = data[:otlpMaxResponse]
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg := strings.TrimSpace(string(data))
		if over {
			msg += "…"
		}
		if msg == "" {
			msg = "(empty)"
		}
		err := fmt.Errorf("POST %s: %s (body: %q)", s.url, resp.Status, msg)
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			// OTLP/HTTP throttling: the Collector says when to come back.
			if after, ok := retryAfter(resp.Header.Values("Retry-After"), time.Now()); ok {
				return &ThrottledError{After: after, Err: err}
			}
		}
		return err
	}
	switch {
	case err != nil:
		return fmt.Errorf("POST %s: read response: %w", s.url, err)
	case over:
		return fmt.Errorf("POST %s: response body over %d bytes", s.url, otlpMaxResponse)
	case len(data) == 0 || resp.Header.Get("Content-Type") != "application/x-protobuf":
		return nil // the SDK's rule: only a protobuf body can report a partial success
	}
	var ack collogpb.ExportLogsServiceResponse
	if err := proto.Unmarshal(data, &ack); err != nil {
		return fmt.Errorf("POST %s: decode ExportLogsServiceResponse: %w", s.url, err)
	}
	return partialSuccess(&ack)
}

func (s *otlpSender) export(ctx context.Context, body []byte) error {
	md := s.md
	if out, ok := metadata.FromOutgoingContext(ctx); ok {
		md = metadata.Join(md, out)
	}
	if md.Len() > 0 {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	var ack collogpb.ExportLogsServiceResponse
	if err := s.conn.Invoke(ctx, otlpExportMethod, &body, &ack); err != nil {
		err = fmt.Errorf("gRPC Export to %s: %w", s.conn.Target(), err)
		if after, ok := retryInfo(err); ok {
			return &ThrottledError{After: after, Err: err}
		}
		return err
	}
	return partialSuccess(&ack)
}

// partialSuccess is what a Collector's partial success reports: a *RejectedError, with which
// the Follower moves on. The request was accepted; the OTLP specification forbids sending it
// again (the Collector treats a partial success it gets as a success with a warning too). A
// message without rejected records is a warning, reported the same way.
func partialSuccess(ack *collogpb.ExportLogsServiceResponse) error {
	ps := ack.GetPartialSuccess()
	if n, msg := ps.GetRejectedLogRecords(), ps.GetErrorMessage(); n != 0 || msg != "" {
		return &RejectedError{Lines: n, Reason: msg}
	}
	return nil
}

// shutdown releases connections.
func (s *otlpSender) shutdown(ctx context.Context) error {
	if s.conn != nil {
		return errors.Join(s.conn.Close(), ctx.Err())
	}
	s.client.CloseIdleConnections()
	return ctx.Err()
}

// preEncodedCodec is the codec of Export calls: the request is protobuf already, so it goes as
// it is, and the response is decoded as usual. It is given per connection (ForceCodecV2), never
// registered, so no other gRPC client of the process sees it. Its name makes the content-type
// application/grpc+proto, where the generated client sends application/grpc; both are gRPC's.
type preEncodedCodec struct{}

func (preEncodedCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("otlp codec: cannot marshal %T", v)
	}
	// A copy from gRPC's pool, which gRPC frees when its transport is done with it: that can be
	// after Invoke returns (a refused call's unsent frames), and the caller reuses its buffer.
	return mem.BufferSlice{mem.Copy(*b, mem.DefaultBufferPool())}, nil
}

func (preEncodedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("otlp codec: cannot unmarshal into %T", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

func (preEncodedCodec) Name() string { return "proto" }

// gzipBuffer compresses request bodies; pooled, as a gzip.Writer's state is large.
type gzipBuffer struct {
	w   *gzip.Writer
	out bytes.Buffer
}

func (z *gzipBuffer) compress(b []byte) ([]byte, error) {
	z.out.Reset()
	z.w.Reset(&z.out)
	if _, err := z.w.Write(b); err != nil {
		return nil, err
	}
	if err := z.w.Close(); err != nil {
		return nil, err
	}
	return z.out.Bytes(), nil
}

var errSendReturned = errors.New("audit otlp exporter: request body read after send returned")

// bodyGate lends a request body to net/http until send returns: the transport may still read a
// body after Do returned (the response can come before the body is written, golang/go#26409),
// and the caller reuses its buffer for the next batch.
type bodyGate struct {
	mu     sync.Mutex
	b      []byte
	closed bool
}

func (g *bodyGate) open() io.ReadCloser { return &gatedBody{gate: g, r: bytes.NewReader(g.b)} }

func (g *bodyGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

type gatedBody struct {
	gate *bodyGate
	r    *bytes.Reader
}

func (b *gatedBody) Read(p []byte) (int, error) {
	b.gate.mu.Lock()
	defer b.gate.mu.Unlock()
	if b.gate.closed {
		return 0, errSendReturned
	}
	return b.r.Read(p)
}

func (*gatedBody) Close() error { return nil }

// otlpTarget is an OTLPConfig resolved against the environment, as the OpenTelemetry exporters
// (otlploghttp and otlploggrpc v0.23.0) resolve their options.
type otlpTarget struct {
	endpoint string      // OTLP/HTTP: the URL; OTLP/gRPC: host:port
	insecure bool        // plain text; over gRPC only without tls, which wins
	tls      *tls.Config // nil: the system's roots
	headers  map[string]string
	gzip     bool
	timeout  time.Duration
}

// otlpEnv looks a setting up as the exporters do: OTEL_EXPORTER_OTLP_LOGS_<name>, else
// OTEL_EXPORTER_OTLP_<name>. key is the variable found, for errors.
type otlpEnv func(string) string

func (env otlpEnv) lookup(name string) (key, value string) {
	for _, k := range [...]string{"OTEL_EXPORTER_OTLP_LOGS_" + name, "OTEL_EXPORTER_OTLP_" + name} {
		if v := env(k); v != "" {
			return k, v
		}
	}
	return "", ""
}

// resolveOTLPTarget applies the exporters' precedence: a field of cfg, else the variables, else
// the defaults. Only what cfg leaves open is read from the environment.
func resolveOTLPTarget(cfg OTLPConfig, isGRPC bool, env otlpEnv) (otlpTarget, error) {
	var t otlpTarget
	u, scheme, err := resolveOTLPEndpoint(cfg, isGRPC, env)
	if err != nil {
		return t, err
	}
	switch {
	case cfg.Insecure:
		t.insecure = true
	case scheme == "https":
	case scheme != "":
		t.insecure = true // http, or any other scheme, as the exporters read it
	default:
		if key, v := env.lookup("INSECURE"); key != "" {
			switch strings.ToLower(v) {
			case "true":
				t.insecure = true
			case "false":
			default:
				return t, fmt.Errorf("%s: %q is not true or false", key, v)
			}
		}
	}
	t.endpoint = u.Host
	if !isGRPC {
		// As the exporter builds it: the scheme from insecure, no user info, query or fragment.
		out := url.URL{Scheme: "https", Host: u.Host, Path: u.Path}
		if t.insecure {
			out.Scheme = "http"
		}
		t.endpoint = out.String()
	}
	if err := resolveOTLPRequest(&t, cfg, env); err != nil {
		return t, err
	}
	if cfg.Auth != nil && !cfg.Insecure && t.insecure && t.tls == nil {
		return t, fmt.Errorf("the auth header would be sent in plain text to %s: use an https:// endpoint, or configure the endpoint as insecure (loopback only)", u.Host)
	}
	return t, nil
}

// resolveOTLPEndpoint is where the exporters send: cfg.Endpoint, else the endpoint variable,
// else localhost; and the scheme that decides insecure (the variable's when cfg.Endpoint has
// none).
func resolveOTLPEndpoint(cfg OTLPConfig, isGRPC bool, env otlpEnv) (*url.URL, string, error) {
	envKey, envURL, envErr := "", (*url.URL)(nil), error(nil)
	if key, v := env.lookup("ENDPOINT"); key != "" {
		envKey = key
		if envURL, envErr = parseOTLPEndpoint(v); envErr != nil {
			envErr = fmt.Errorf("%s: %w", key, envErr)
		}
	}
	var u *url.URL
	switch {
	case cfg.Endpoint != "":
		// What cfg.Endpoint has always meant: over HTTP, without a path it gets /v1/logs
		// (logsURL); over gRPC, its path is ignored.
		raw := cfg.Endpoint
		if !isGRPC {
			raw = logsURL(raw)
		}
		var err error
		if u, err = parseOTLPEndpoint(raw); err != nil {
			return nil, "", fmt.Errorf("endpoint: %w", err)
		}
	case envErr != nil:
		return nil, "", envErr
	case envURL != nil:
		u = &url.URL{Scheme: envURL.Scheme, Host: envURL.Host, Path: envURL.Path}
		switch {
		case isGRPC:
		case envKey == "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT" && u.Path == "":
			u.Path = "/" // the signal's URL is taken as it is
		case envKey == "OTEL_EXPORTER_OTLP_ENDPOINT":
			u.Path = path.Join(u.Path, "/v1/logs")
		}
	default:
		u = &url.URL{Host: "localhost:4318", Path: "/v1/logs"}
		if isGRPC {
			u.Host = "localhost:4317"
		}
	}
	scheme := u.Scheme
	if scheme == "" && cfg.Endpoint != "" && envURL != nil {
		scheme = envURL.Scheme
	}
	return u, scheme, nil
}

// resolveOTLPRequest sets what every request carries: headers, compression, the timeout and the
// TLS configuration.
func resolveOTLPRequest(t *otlpTarget, cfg OTLPConfig, env otlpEnv) error {
	var err error
	if t.headers = cfg.Headers; len(t.headers) == 0 {
		if key, v := env.lookup("HEADERS"); key != "" {
			if t.headers, err = parseOTLPHeaders(v); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	if key, v := env.lookup("COMPRESSION"); key != "" {
		switch v {
		case "gzip":
			t.gzip = true
		case "none":
		default:
			return fmt.Errorf("%s: %q is not gzip or none", key, v)
		}
	}
	t.timeout = otlpDefaultTimeout
	if cfg.Timeout > 0 {
		t.timeout = cfg.Timeout
	} else if key, v := env.lookup("TIMEOUT"); key != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			return fmt.Errorf("%s: %q is not a number of milliseconds", key, v)
		}
		t.timeout = time.Duration(ms) * time.Millisecond
	}
	if cfg.TLS != nil {
		t.tls = cfg.TLS.Clone()
	} else if t.tls, err = otlpEnvTLS(env); err != nil {
		return err
	}
	return nil
}

// parseOTLPEndpoint parses an endpoint URL; one without a host ("collector:4318") is refused,
// where the exporters would send to no host at every export. The error does not quote the URL,
// which can carry a password.
func parseOTLPEndpoint(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("not a URL: %w", err)
	}
	if u.Host == "" {
		return nil, errors.New("has no host: use http://host:port or https://host:port")
	}
	return u, nil
}

// parseOTLPHeaders parses k1=v1,k2=v2 as the exporters do: keys trimmed and HTTP tokens, values
// URL-path-unescaped, then trimmed. Errors name an entry by its position: values are secrets.
func parseOTLPHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	for i, entry := range strings.Split(s, ",") {
		rawKey, rawVal, ok := strings.Cut(entry, "=")
		key := strings.TrimSpace(rawKey)
		if !ok {
			return nil, fmt.Errorf("entry %d is not key=value", i+1)
		}
		if !httpguts.ValidHeaderFieldName(key) {
			return nil, fmt.Errorf("entry %d: the key is not an HTTP header name", i+1)
		}
		val, err := url.PathUnescape(rawVal)
		if err != nil {
			return nil, fmt.Errorf("entry %d (%s): the value is not URL-escaped", i+1, key)
		}
		out[key] = strings.TrimSpace(val)
	}
	return out, nil
}

// otlpEnvTLS is the TLS configuration the certificate variables give, nil for none. As in the
// exporters, a client certificate comes from the first pair of variables that are both set.
func otlpEnvTLS(env otlpEnv) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if key, file := env.lookup("CERTIFICATE"); key != "" {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s has no PEM certificate", key, file)
		}
	}
	for _, prefix := range [...]string{"OTEL_EXPORTER_OTLP_LOGS_", "OTEL_EXPORTER_OTLP_"} {
		certFile, keyFile := env(prefix+"CLIENT_CERTIFICATE"), env(prefix+"CLIENT_KEY")
		if certFile == "" || keyFile == "" {
			continue
		}
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%sCLIENT_CERTIFICATE and %[1]sCLIENT_KEY: %w", prefix, err)
		}
		c.Certificates = []tls.Certificate{cert}
		break
	}
	if c.RootCAs == nil && c.Certificates == nil {
		return nil, nil
	}
	return c, nil
}
