package audit

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"google.golang.org/grpc"
)

// AuthHeader returns the header that authenticates an export and its value, read at each export
// so that a rotated credential is used from the next export on ("" for none).
type AuthHeader func() (name, value string)

// httpAuth sends the auth header on every OTLP/HTTP request. The exporter's own client options
// give way to a client of ours, so TLS comes from cfg.TLS here (the OTEL_*_CERTIFICATE variables
// are not read when an auth header is configured).
func httpAuth(cfg OTLPConfig) otlploghttp.Option {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.TLS != nil {
		tr.TLSClientConfig = cfg.TLS.Clone()
	} else {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return otlploghttp.WithHTTPClient(&http.Client{Timeout: cfg.Timeout, Transport: &authTransport{base: tr, auth: cfg.Auth}})
}

type authTransport struct {
	base http.RoundTripper
	auth AuthHeader
}

func (a *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if name, value := a.auth(); name != "" {
		r = r.Clone(r.Context())
		r.Header.Set(name, value)
	}
	return a.base.RoundTrip(r)
}

// grpcAuth sends the auth header as metadata on every OTLP/gRPC call.
func grpcAuth(cfg OTLPConfig) otlploggrpc.Option {
	return otlploggrpc.WithDialOption(grpc.WithPerRPCCredentials(rpcAuth{auth: cfg.Auth, insecure: cfg.Insecure}))
}

type rpcAuth struct {
	auth     AuthHeader
	insecure bool
}

func (a rpcAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	name, value := a.auth()
	if name == "" {
		return nil, nil
	}
	return map[string]string{strings.ToLower(name): value}, nil
}

// RequireTransportSecurity is false only for an endpoint configured insecure, which the config
// allows with an auth header on loopback alone.
func (a rpcAuth) RequireTransportSecurity() bool { return !a.insecure }
