package audit

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	collogpb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandgate/sandgate/test/redistest"
)

// senderEnvNames are the variables the OTLP log exporters read, each cleared or set for a run of
// the SDK's exporter, which reads the process's environment.
func senderEnvNames() []string {
	var keys []string
	for _, p := range []string{"OTEL_EXPORTER_OTLP_LOGS_", "OTEL_EXPORTER_OTLP_"} {
		for _, n := range []string{"ENDPOINT", "INSECURE", "HEADERS", "COMPRESSION", "TIMEOUT", "CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			keys = append(keys, p+n)
		}
	}
	return keys
}

// senderBody is the record body of the differential tests: compressible, so that gzip shows.
var senderBody = strings.Repeat("sandgate audit line ", 5000)

// sdkOTLPExporter is the exporter newOTLPLogExporter (otlp.go) built before otlpSender: the
// reference the sender is held to. Unlike it, it leaves the timeout to the variables when cfg
// has none (NewOTLPExporter always set one), and it has no auth option (the SDK's was ours:
// TestOTLPSenderReadsTheAuthHeaderAtEachSend covers it).
func sdkOTLPExporter(t *testing.T, cfg OTLPConfig) sdklog.Exporter {
	t.Helper()
	ctx := context.Background()
	var exp sdklog.Exporter
	var err error
	switch cfg.Protocol {
	case OTLPProtocolHTTP, "":
		opts := []otlploghttp.Option{otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false})}
		if cfg.Timeout > 0 {
			opts = append(opts, otlploghttp.WithTimeout(cfg.Timeout))
		}
		if cfg.Endpoint != "" {
			opts = append(opts, otlploghttp.WithEndpointURL(logsURL(cfg.Endpoint)))
		}
		if cfg.Insecure {
			opts = append(opts, otlploghttp.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlploghttp.WithHeaders(cfg.Headers))
		}
		if cfg.TLS != nil {
			opts = append(opts, otlploghttp.WithTLSClientConfig(cfg.TLS))
		}
		exp, err = otlploghttp.New(ctx, opts...)
	case OTLPProtocolGRPC:
		opts := []otlploggrpc.Option{otlploggrpc.WithRetry(otlploggrpc.RetryConfig{Enabled: false})}
		if cfg.Timeout > 0 {
			opts = append(opts, otlploggrpc.WithTimeout(cfg.Timeout))
		}
		if cfg.Endpoint != "" {
			opts = append(opts, otlploggrpc.WithEndpointURL(cfg.Endpoint))
		}
		if cfg.Insecure {
			opts = append(opts, otlploggrpc.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlploggrpc.WithHeaders(cfg.Headers))
		}
		if cfg.TLS != nil {
			opts = append(opts, otlploggrpc.WithTLSCredentials(credentials.NewTLS(cfg.TLS)))
		}
		exp, err = otlploggrpc.New(ctx, opts...)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	return exp
}

// sdkExportOne exports one record with senderBody through exp, as the SDK's Logger builds it.
func sdkExportOne(exp sdklog.Exporter) error {
	var catch senderRecordCatcher
	provider := sdklog.NewLoggerProvider(sdklog.WithProcessor(&catch))
	defer provider.Shutdown(context.Background())
	var r otellog.Record
	r.SetBody(attribute.StringValue(senderBody))
	provider.Logger("sender-test").Emit(context.Background(), r)
	return exp.Export(context.Background(), []sdklog.Record{catch.rec})
}

type senderRecordCatcher struct{ rec sdklog.Record }

func (c *senderRecordCatcher) OnEmit(_ context.Context, r *sdklog.Record) error {
	c.rec = r.Clone()
	return nil
}
func (*senderRecordCatcher) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (*senderRecordCatcher) Shutdown(context.Context) error                         { return nil }
func (*senderRecordCatcher) ForceFlush(context.Context) error                       { return nil }

// senderRequest is what a loopback receiver saw of one export.
type senderRequest struct {
	Method, Path string      // OTLP/gRPC: the full method in Path
	Header       http.Header // OTLP/gRPC: the metadata; without the user agent either way
	Body         []byte      // decompressed
	WireBytes    int64       // OTLP/gRPC: what the connection carried, to see compression
	ClientCert   string      // the client certificate's common name, over TLS
}

// senderHTTPReceiver is a loopback OTLP/HTTP receiver that keeps the requests it receives and
// answers with respond (200 without a body when nil).
type senderHTTPReceiver struct {
	*httptest.Server
	respond http.HandlerFunc
	mu      sync.Mutex
	reqs    []senderRequest
}

func newSenderHTTPReceiver(t *testing.T, serverTLS *tls.Config, respond http.HandlerFunc) *senderHTTPReceiver {
	t.Helper()
	rc := &senderHTTPReceiver{respond: respond}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	if serverTLS != nil {
		rc.TLS = serverTLS
		rc.StartTLS()
	} else {
		rc.Start()
	}
	t.Cleanup(rc.Close)
	return rc
}

func (rc *senderHTTPReceiver) serve(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h := r.Header.Clone()
	h.Del("User-Agent")
	h.Del("Content-Length") // chunked for the SDK's gzip, not for ours
	req := senderRequest{Method: r.Method, Path: r.URL.Path, Header: h, Body: b}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		req.ClientCert = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, req)
	rc.mu.Unlock()
	if rc.respond != nil {
		rc.respond(w, r)
	}
}

// take returns the requests received since the last take.
func (rc *senderHTTPReceiver) take() []senderRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.reqs
	rc.reqs = nil
	return out
}

func (rc *senderHTTPReceiver) addr() string { return rc.Listener.Addr().String() }

// senderGRPCReceiver is a loopback OTLP/gRPC receiver that keeps the raw requests it receives
// and answers with respond (an empty ExportLogsServiceResponse when nil).
type senderGRPCReceiver struct {
	lis     net.Listener
	wire    atomic.Int64
	respond func(ctx context.Context) (*collogpb.ExportLogsServiceResponse, error)
	mu      sync.Mutex
	reqs    []senderRequest
}

func newSenderGRPCReceiver(t *testing.T, serverTLS *tls.Config, respond func(context.Context) (*collogpb.ExportLogsServiceResponse, error)) *senderGRPCReceiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rc := &senderGRPCReceiver{respond: respond}
	rc.lis = senderCountingListener{lis, &rc.wire}
	opts := []grpc.ServerOption{grpc.ForceServerCodecV2(senderServerCodec{}), grpc.UnknownServiceHandler(rc.serve)}
	if serverTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(serverTLS)))
	}
	srv := grpc.NewServer(opts...)
	go func() { _ = srv.Serve(rc.lis) }()
	t.Cleanup(srv.Stop)
	return rc
}

func (rc *senderGRPCReceiver) serve(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	var body []byte
	if err := stream.RecvMsg(&body); err != nil {
		return err
	}
	md, _ := metadata.FromIncomingContext(stream.Context())
	h := http.Header{} // canonical keys, as an HTTP request's
	for k, vs := range md {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	h.Del("User-Agent")
	req := senderRequest{Method: "POST", Path: method, Header: h, Body: body}
	if p, ok := peer.FromContext(stream.Context()); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
			req.ClientCert = info.State.PeerCertificates[0].Subject.CommonName
		}
	}
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, req)
	rc.mu.Unlock()
	resp := &collogpb.ExportLogsServiceResponse{}
	if rc.respond != nil {
		var err error
		if resp, err = rc.respond(stream.Context()); err != nil {
			return err
		}
	}
	return stream.SendMsg(resp)
}

// take returns the requests received since the last take, with the bytes read meanwhile.
func (rc *senderGRPCReceiver) take() []senderRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.reqs
	rc.reqs = nil
	if len(out) > 0 {
		out[len(out)-1].WireBytes = rc.wire.Swap(0)
	}
	return out
}

func (rc *senderGRPCReceiver) addr() string { return rc.lis.Addr().String() }

// senderServerCodec is the test receiver's codec: requests as raw bytes, responses as protobuf.
type senderServerCodec struct{}

func (senderServerCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (senderServerCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (senderServerCodec) Name() string { return "proto" }

type senderCountingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l senderCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return senderCountingConn{c, l.n}, nil
}

type senderCountingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c senderCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// senderTLS is a server's TLS configuration that wants a client certificate of files' CA, and a
// client's that trusts the CA and presents the client certificate.
func senderTLS(t *testing.T, files redistest.TLSFiles) (server, client *tls.Config) {
	t.Helper()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(files.CA)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(ca))
	srvCert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	require.NoError(t, err)
	cliCert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	require.NoError(t, err)
	server = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	client = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cliCert}, MinVersion: tls.VersionTLS12}
	return server, client
}

// senderCase is one configuration of the differential tests: env and cfg.Endpoint with {addr}
// for the receiver's host:port.
type senderCase struct {
	name    string
	secure  bool // the receiver speaks TLS and wants a client certificate
	hang    bool // the receiver never answers: both time out
	env     map[string]string
	cfg     OTLPConfig
	gzipped bool // OTLP/gRPC: the request was compressed on the wire
}

func (c senderCase) resolve(addr string) (map[string]string, OTLPConfig) {
	env := map[string]string{}
	for k, v := range c.env {
		env[k] = strings.ReplaceAll(v, "{addr}", addr)
	}
	cfg := c.cfg
	cfg.Endpoint = strings.ReplaceAll(cfg.Endpoint, "{addr}", addr)
	return env, cfg
}

// runSenderCase exports a record with the SDK's exporter, then sends the body the SDK sent with
// an otlpSender of the same configuration, and returns what the receiver saw of each and their
// errors.
func runSenderCase(t *testing.T, tc senderCase, addr string, take func() []senderRequest) (sdk, ours senderRequest, sdkErr, ourErr error) {
	t.Helper()
	env, cfg := tc.resolve(addr)
	for _, k := range senderEnvNames() {
		t.Setenv(k, env[k]) // empty is unset to the SDK
	}
	sdkErr = sdkExportOne(sdkOTLPExporter(t, cfg))
	got := take()
	require.Len(t, got, 1, "the SDK's request")
	sdk = got[0]

	s, err := newOTLPSender(cfg, func(k string) string { return env[k] })
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.shutdown(context.Background()) })
	ourErr = s.send(context.Background(), sdk.Body)
	got = take()
	require.Len(t, got, 1, "our request")
	return sdk, got[0], sdkErr, ourErr
}

// assertSameOutcome: both exports succeeded, or (tc.hang) both timed out.
func assertSameOutcome(t *testing.T, tc senderCase, sdkErr, ourErr error) {
	t.Helper()
	if !tc.hang {
		require.NoError(t, sdkErr, "the SDK's export")
		require.NoError(t, ourErr, "our send")
		return
	}
	for who, err := range map[string]error{"the SDK": sdkErr, "ours": ourErr} {
		var ne net.Error
		isTimeout := errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() || status.Code(err) == codes.DeadlineExceeded
		assert.True(t, isTimeout, "%s timed out: %v", who, err)
	}
}

const (
	envEndpoint     = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envLogsEndpoint = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"
)

// TestOTLPSenderAgreesWithTheSDKOverHTTP holds otlpSender's configuration to the OTLP/HTTP log
// exporter's: for each configuration, the request the SDK sends and ours (with the SDK's body)
// reach the same receiver with the same method, path, headers and body. Not parallel: the SDK
// reads the process's environment.
func TestOTLPSenderAgreesWithTheSDKOverHTTP(t *testing.T) {
	files := redistest.MakeTLSFiles(t)
	serverTLS, clientTLS := senderTLS(t, files)
	plain := newSenderHTTPReceiver(t, nil, nil)
	secure := newSenderHTTPReceiver(t, serverTLS, nil)
	hung := newSenderHTTPReceiver(t, nil, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	certs := map[string]string{envEndpoint: "https://{addr}", "OTEL_EXPORTER_OTLP_CERTIFICATE": files.CA,
		"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": files.ClientCert, "OTEL_EXPORTER_OTLP_CLIENT_KEY": files.ClientKey}

	cases := []senderCase{
		{name: "the generic endpoint gets /v1/logs", env: map[string]string{envEndpoint: "http://{addr}"}},
		{name: "the generic endpoint's path gets /v1/logs joined to it", env: map[string]string{envEndpoint: "http://{addr}/otlp/"}},
		{name: "the logs endpoint wins and is used with its path as it is",
			env: map[string]string{envLogsEndpoint: "http://{addr}/collector/logs", envEndpoint: "http://127.0.0.1:1"}},
		{name: "the logs endpoint without a path posts to /", env: map[string]string{envLogsEndpoint: "http://{addr}"}},
		{name: "an endpoint without a scheme is insecure by the insecure variable",
			env: map[string]string{envEndpoint: "//{addr}", "OTEL_EXPORTER_OTLP_LOGS_INSECURE": "TRUE", "OTEL_EXPORTER_OTLP_INSECURE": "false"}},
		{name: "header values are unescaped and trimmed and the logs variable wins",
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_LOGS_HEADERS": " x-tenant=a%20b , X-Scope = c%2Cd%3De ,empty=",
				"OTEL_EXPORTER_OTLP_HEADERS": "x-ignored=1"}},
		{name: "gzip compression", env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}},
		{name: "the logs compression variable wins",
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}},
		{name: "the timeout variable bounds an export", hang: true,
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "100", "OTEL_EXPORTER_OTLP_TIMEOUT": "600000"}},
		{name: "the config's timeout wins over the variable", hang: true,
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_TIMEOUT": "600000"}, cfg: OTLPConfig{Timeout: 100 * time.Millisecond}},
		{name: "the config's endpoint, insecure and headers win over the variables",
			env: map[string]string{envEndpoint: "https://127.0.0.1:1/ignored", "OTEL_EXPORTER_OTLP_HEADERS": "x-env=1", "OTEL_EXPORTER_OTLP_INSECURE": "false"},
			cfg: OTLPConfig{Endpoint: "http://{addr}", Insecure: true, Headers: map[string]string{"X-Cfg": "2", "Content-Type": "text/plain"}}},
		{name: "the config's endpoint with a path is used as it is", cfg: OTLPConfig{Endpoint: "http://{addr}/custom/path", Insecure: true}},
		{name: "the certificate variables trust the Collector and present a client certificate", secure: true, env: certs},
		{name: "the config's TLS wins over the certificate variables", secure: true,
			env: map[string]string{envEndpoint: "https://{addr}", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent"}, cfg: OTLPConfig{TLS: clientTLS}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := plain
			switch {
			case tc.secure:
				rc = secure
			case tc.hang:
				rc = hung
			}
			sdk, ours, sdkErr, ourErr := runSenderCase(t, tc, rc.addr(), rc.take)
			assertSameOutcome(t, tc, sdkErr, ourErr)
			assert.Equal(t, sdk, ours)
			assert.Equal(t, "POST", ours.Method)
			assert.Equal(t, "application/x-protobuf", ours.Header.Get("Content-Type"))
			if tc.secure {
				assert.Equal(t, "redistest client", ours.ClientCert)
			}
		})
	}
}

// TestOTLPSenderAgreesWithTheSDKOverGRPC is the same for the OTLP/gRPC log exporter: the same
// method, metadata and message, compressed alike. The content-type differs by design
// (application/grpc+proto for application/grpc, see preEncodedCodec).
func TestOTLPSenderAgreesWithTheSDKOverGRPC(t *testing.T) {
	files := redistest.MakeTLSFiles(t)
	serverTLS, clientTLS := senderTLS(t, files)
	plain := newSenderGRPCReceiver(t, nil, nil)
	secure := newSenderGRPCReceiver(t, serverTLS, nil)
	hung := newSenderGRPCReceiver(t, nil, func(ctx context.Context) (*collogpb.ExportLogsServiceResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	grpcCfg := OTLPConfig{Protocol: OTLPProtocolGRPC}

	cases := []senderCase{
		{name: "the generic endpoint, its path ignored", env: map[string]string{envEndpoint: "http://{addr}/ignored"}, cfg: grpcCfg},
		{name: "the logs endpoint wins", env: map[string]string{envLogsEndpoint: "http://{addr}", envEndpoint: "http://127.0.0.1:1"}, cfg: grpcCfg},
		{name: "an endpoint without a scheme is insecure by the insecure variable",
			env: map[string]string{envEndpoint: "//{addr}", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, cfg: grpcCfg},
		{name: "header values are unescaped and trimmed",
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_HEADERS": "X-Tenant=a%20b , x-scope = c%2Cd "}, cfg: grpcCfg},
		{name: "gzip compression", gzipped: true,
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION": "gzip"}, cfg: grpcCfg},
		{name: "the timeout variable bounds an export", hang: true,
			env: map[string]string{envEndpoint: "http://{addr}", "OTEL_EXPORTER_OTLP_TIMEOUT": "100"}, cfg: grpcCfg},
		{name: "the config's endpoint, insecure and headers win over the variables",
			env: map[string]string{envEndpoint: "https://127.0.0.1:1", "OTEL_EXPORTER_OTLP_HEADERS": "x-env=1"},
			cfg: OTLPConfig{Protocol: OTLPProtocolGRPC, Endpoint: "http://{addr}/ignored", Insecure: true, Headers: map[string]string{"X-Cfg": "2"}}},
		{name: "the certificate variables trust the Collector and present a client certificate", secure: true, cfg: grpcCfg,
			env: map[string]string{envEndpoint: "https://{addr}", "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": files.CA,
				"OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE": files.ClientCert, "OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY": files.ClientKey}},
		{name: "the config's TLS wins over the certificate variables and insecure", secure: true,
			env: map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent"},
			cfg: OTLPConfig{Protocol: OTLPProtocolGRPC, Endpoint: "http://{addr}", Insecure: true, TLS: clientTLS}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := plain
			switch {
			case tc.secure:
				rc = secure
			case tc.hang:
				rc = hung
			}
			sdk, ours, sdkErr, ourErr := runSenderCase(t, tc, rc.addr(), rc.take)
			assertSameOutcome(t, tc, sdkErr, ourErr)
			assert.Equal(t, "application/grpc", sdk.Header.Get("Content-Type"))
			assert.Equal(t, "application/grpc+proto", ours.Header.Get("Content-Type"))
			sdk.Header.Del("Content-Type")
			ours.Header.Del("Content-Type")
			if !tc.hang {
				body := int64(len(sdk.Body))
				assert.Equal(t, tc.gzipped, sdk.WireBytes < body/2, "the SDK's request compressed (%d bytes for %d)", sdk.WireBytes, body)
				assert.Equal(t, tc.gzipped, ours.WireBytes < body/2, "our request compressed (%d bytes for %d)", ours.WireBytes, body)
			}
			sdk.WireBytes, ours.WireBytes = 0, 0
			assert.Equal(t, sdk, ours)
			assert.Equal(t, otlpExportMethod, ours.Path)
			if tc.secure {
				assert.Equal(t, "redistest client", ours.ClientCert)
			}
		})
	}
}

// endlessBody writes status and a body that does not end until the client goes away.
func endlessBody(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(status)
		chunk := []byte(strings.Repeat("x", 32<<10))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
}

func protobufAnswer(t *testing.T, resp *collogpb.ExportLogsServiceResponse) http.HandlerFunc {
	b, err := proto.Marshal(resp)
	require.NoError(t, err)
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	}
}

func partial(n int64, msg string) *collogpb.ExportLogsServiceResponse {
	return &collogpb.ExportLogsServiceResponse{PartialSuccess: &collogpb.ExportLogsPartialSuccess{RejectedLogRecords: n, ErrorMessage: msg}}
}

// TestOTLPSenderReportsWhatTheCollectorDidNotAcknowledge: send returns nil only for an
// acknowledgement of every record, a RejectedError for a partial success (the request was
// taken; OTLP forbids sending it again), and otherwise an error that says what the Collector
// said.
func TestOTLPSenderReportsWhatTheCollectorDidNotAcknowledge(t *testing.T) {
	cases := []struct {
		name    string
		respond http.HandlerFunc
		want    []string // in the error; none: acknowledged
	}{
		{"an empty 200 is an acknowledgement", nil, nil},
		{"an empty partial success is an acknowledgement", protobufAnswer(t, &collogpb.ExportLogsServiceResponse{PartialSuccess: &collogpb.ExportLogsPartialSuccess{}}), nil},
		{"a body that is not protobuf is not read as a response", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "\xff\xff not protobuf")
		}, nil},
		{"a refusal gives its status and its body", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "  bad request: field x  ", http.StatusBadRequest)
		}, []string{"400 Bad Request", `"bad request: field x"`}},
		{"503 without a body", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) },
			[]string{"503 Service Unavailable", "(empty)"}},
		{"a partial success reports the records refused for good", protobufAnswer(t, partial(2, "two were bad")), []string{"refused 2 lines for good", "two were bad"}},
		{"a partial success with only a message reports the warning", protobufAnswer(t, partial(0, "a warning")), []string{"refused 0 lines", "a warning"}},
		{"a protobuf body that does not decode", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/x-protobuf")
			_, _ = w.Write([]byte{0xff, 0xff, 0xff})
		}, []string{"decode ExportLogsServiceResponse"}},
		{"a redirect is not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		}, []string{"307 Temporary Redirect"}},
		{"a 200 that does not end is not read to its end", endlessBody(http.StatusOK), []string{"response body over 65536 bytes"}},
		{"a 500 that does not end is quoted in part", endlessBody(http.StatusInternalServerError), []string{"500 Internal Server Error", "xxx…"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newSenderHTTPReceiver(t, nil, tc.respond)
			s, err := newOTLPSender(OTLPConfig{Endpoint: rc.URL, Insecure: true, Timeout: 20 * time.Second}, senderNoEnv)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.shutdown(context.Background()) })
			err = s.send(ctxTimeout(t, 30*time.Second), []byte("request"))
			assert.Len(t, rc.take(), 1, "sent once")
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			var rejected *RejectedError
			assert.Equal(t, strings.Contains(tc.name, "partial success"), errors.As(err, &rejected),
				"only a partial success is a RejectedError, which the follower does not send again")
			assert.Less(t, len(err.Error()), otlpMaxResponse+500, "the error quotes a bounded part of the body")
		})
	}
}

// TestOTLPSenderReportsWhatTheCollectorDidNotAcknowledgeOverGRPC: a status other than OK is an
// error that says so, and a partial success a RejectedError.
func TestOTLPSenderReportsWhatTheCollectorDidNotAcknowledgeOverGRPC(t *testing.T) {
	cases := []struct {
		name    string
		respond func(context.Context) (*collogpb.ExportLogsServiceResponse, error)
		want    []string
	}{
		{"an empty response is an acknowledgement", nil, nil},
		{"a status other than OK", func(context.Context) (*collogpb.ExportLogsServiceResponse, error) {
			return nil, status.Error(codes.Unavailable, "collector is draining")
		}, []string{"Unavailable", "collector is draining"}},
		{"a partial success", func(context.Context) (*collogpb.ExportLogsServiceResponse, error) {
			return partial(3, "three were bad"), nil
		}, []string{"refused 3 lines for good", "three were bad"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := newSenderGRPCReceiver(t, nil, tc.respond)
			s, err := newOTLPSender(OTLPConfig{Protocol: OTLPProtocolGRPC, Endpoint: "http://" + rc.addr(), Insecure: true}, senderNoEnv)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.shutdown(context.Background()) })
			err = s.send(ctxTimeout(t, 30*time.Second), []byte{0x0a, 0x00})
			require.Len(t, rc.take(), 1, "sent once")
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func senderNoEnv(string) string { return "" }

// TestOTLPSenderRefusesWhatDoesNotParse: a variable the exporters would log and ignore, or a
// certificate that does not load, is an error naming it, and never quoting a header's value; a
// variable the config overrides is not read.
func TestOTLPSenderRefusesWhatDoesNotParse(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	files := redistest.MakeTLSFiles(t)
	_, clientTLS := senderTLS(t, files)
	auth := func() (string, string) { return "Authorization", "Bearer t" }
	cases := []struct {
		name string
		cfg  OTLPConfig
		env  map[string]string
		want string // in the error; "": no error
	}{
		{"a timeout that is not a number", OTLPConfig{}, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{"a negative timeout", OTLPConfig{Protocol: OTLPProtocolGRPC}, map[string]string{"OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "-5"}, "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT"},
		{"an unknown compression", OTLPConfig{}, map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		{"a header entry without =", OTLPConfig{}, map[string]string{"OTEL_EXPORTER_OTLP_LOGS_HEADERS": "authorization=Bearer s3cret,broken"}, "OTEL_EXPORTER_OTLP_LOGS_HEADERS: entry 2"},
		{"a header key that is not a token", OTLPConfig{}, map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "bad key=s3cret"}, "OTEL_EXPORTER_OTLP_HEADERS: entry 1"},
		{"a header value that is not URL-escaped", OTLPConfig{Protocol: OTLPProtocolGRPC}, map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "k=s3cret%zz"}, "OTEL_EXPORTER_OTLP_HEADERS: entry 1 (k)"},
		{"an endpoint that is not a URL", OTLPConfig{}, map[string]string{envEndpoint: "http://s3cret@[::1"}, envEndpoint},
		{"an endpoint without a host", OTLPConfig{Protocol: OTLPProtocolGRPC}, map[string]string{envLogsEndpoint: "collector:4317"}, envLogsEndpoint + ": has no host"},
		{"an insecure variable that is not a boolean", OTLPConfig{}, map[string]string{envEndpoint: "//collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "yes"}, "OTEL_EXPORTER_OTLP_INSECURE"},
		{"a certificate file that is missing", OTLPConfig{}, map[string]string{"OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": filepath.Join(dir, "missing.pem")}, "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE"},
		{"a certificate file without a certificate", OTLPConfig{}, map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": notPEM}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{"a client certificate that does not load", OTLPConfig{Protocol: OTLPProtocolGRPC},
			map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": notPEM, "OTEL_EXPORTER_OTLP_CLIENT_KEY": files.ClientKey}, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"},
		{"an unknown protocol", OTLPConfig{Protocol: "thrift"}, nil, `protocol "thrift"`},
		{"a config endpoint without a host", OTLPConfig{Endpoint: "collector:4318"}, nil, "endpoint: has no host"},
		{"TLS for an insecure HTTP endpoint", OTLPConfig{Endpoint: "http://127.0.0.1:4318", Insecure: true, TLS: clientTLS}, nil, "insecure"},
		{"an auth header to an http:// endpoint from the environment", OTLPConfig{Auth: auth}, map[string]string{envEndpoint: "http://collector:4318"}, "plain text to collector:4318"},
		{"an auth header to an http:// endpoint from the environment over gRPC", OTLPConfig{Protocol: OTLPProtocolGRPC, Auth: auth},
			map[string]string{envEndpoint: "http://collector:4317"}, "plain text to collector:4317"},

		{"variables the config overrides are not read", OTLPConfig{Endpoint: "https://collector:4318", Headers: map[string]string{"a": "b"}, Timeout: time.Second, TLS: clientTLS},
			map[string]string{envEndpoint: "http://s3cret@[::1", "OTEL_EXPORTER_OTLP_HEADERS": "broken", "OTEL_EXPORTER_OTLP_TIMEOUT": "x", "OTEL_EXPORTER_OTLP_CERTIFICATE": notPEM, "OTEL_EXPORTER_OTLP_INSECURE": "maybe"}, ""},
		{"an auth header to an insecure endpoint the config allows", OTLPConfig{Endpoint: "http://127.0.0.1:4318", Insecure: true, Auth: auth}, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newOTLPSender(tc.cfg, func(k string) string { return tc.env[k] })
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, s.shutdown(context.Background()))
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "s3cret", "a header's value or a URL's user info is not quoted")
		})
	}
}

// TestOTLPSenderResolvesTheTimeout: the config's, else the logs variable's, else the generic
// variable's (milliseconds), else 10s; 0 is none.
func TestOTLPSenderResolvesTheTimeout(t *testing.T) {
	cases := []struct {
		name string
		cfg  time.Duration
		env  map[string]string
		want time.Duration
	}{
		{"the default", 0, nil, 10 * time.Second},
		{"the generic variable", 0, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}, 2500 * time.Millisecond},
		{"the logs variable wins", 0, map[string]string{"OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}, 300 * time.Millisecond},
		{"the config wins", time.Minute, map[string]string{"OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "300"}, time.Minute},
		{"zero is none", 0, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, protocol := range []string{OTLPProtocolHTTP, OTLPProtocolGRPC} {
				s, err := newOTLPSender(OTLPConfig{Protocol: protocol, Timeout: tc.cfg}, func(k string) string { return tc.env[k] })
				require.NoError(t, err)
				assert.Equal(t, tc.want, s.timeout, protocol)
				require.NoError(t, s.shutdown(context.Background()))
			}
		})
	}
}

// TestOTLPExporterTakesTheTimeoutFromTheEnvironment: an exporter whose config leaves the timeout
// unset (sandgate serve without audit.otlp.timeout) uses OTEL_EXPORTER_OTLP_TIMEOUT; a configured
// one wins. (The exporter once defaulted its config to 10s, so the variable was never read.)
func TestOTLPExporterTakesTheTimeoutFromTheEnvironment(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")
	for _, tc := range []struct {
		cfg, want time.Duration
	}{{0, 2500 * time.Millisecond}, {time.Minute, time.Minute}} {
		e, err := NewOTLPExporter(OTLPConfig{Dir: t.TempDir(), Endpoint: "http://127.0.0.1:4318", Insecure: true, Timeout: tc.cfg})
		require.NoError(t, err)
		assert.Equal(t, tc.want, e.sender.timeout, "configured %s", tc.cfg)
		require.NoError(t, e.Shutdown(context.Background()))
	}
}

// TestOTLPSenderReadsTheAuthHeaderAtEachSend: a rotated credential is sent from the next send on,
// and a credential that is gone sends no header.
func TestOTLPSenderReadsTheAuthHeaderAtEachSend(t *testing.T) {
	var mu sync.Mutex
	name, token := "Authorization", "one"
	auth := func() (string, string) {
		mu.Lock()
		defer mu.Unlock()
		if name == "" {
			return "", ""
		}
		return name, "Bearer " + token
	}
	rotate := func(n, tok string) {
		mu.Lock()
		name, token = n, tok
		mu.Unlock()
	}
	httpRC := newSenderHTTPReceiver(t, nil, nil)
	grpcRC := newSenderGRPCReceiver(t, nil, nil)
	for _, tc := range []struct {
		protocol, endpoint string
		take               func() []senderRequest
	}{
		{OTLPProtocolHTTP, httpRC.URL, httpRC.take},
		{OTLPProtocolGRPC, "http://" + grpcRC.addr(), grpcRC.take},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			rotate("Authorization", "one")
			s, err := newOTLPSender(OTLPConfig{Protocol: tc.protocol, Endpoint: tc.endpoint, Insecure: true, Auth: auth}, senderNoEnv)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.shutdown(context.Background()) })
			var got [][]string
			for _, next := range [][2]string{{"Authorization", "two"}, {"", ""}, {}} {
				require.NoError(t, s.send(ctxTimeout(t, 10*time.Second), []byte("request")))
				got = append(got, tc.take()[0].Header.Values("Authorization"))
				rotate(next[0], next[1])
			}
			assert.Equal(t, [][]string{{"Bearer one"}, {"Bearer two"}, nil}, got)
		})
	}
}
