package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// AuditOTLP ships the audit log as OpenTelemetry log records over OTLP to a Collector (the file
// stays the source of truth; docs/audit.md, "Shipping events"). What is left empty here is taken
// from the standard OTEL_EXPORTER_OTLP_* and OTEL_EXPORTER_OTLP_LOGS_* variables; a value set
// here wins over the variable.
type AuditOTLP struct {
	// Enabled turns the exporter on. Setting Endpoint turns it on too.
	Enabled bool `json:"enabled"`
	// Endpoint is the Collector's URL: http://host:port or https://host:port (4317 for gRPC,
	// 4318 for HTTP, whose path defaults to /v1/logs). Empty: the environment's.
	Endpoint string `json:"endpoint"`
	// Protocol is "grpc" or "http/protobuf". Empty: the environment's, else http/protobuf.
	Protocol string `json:"protocol"`
	// Insecure allows an http:// endpoint (plain text), for a Collector on loopback or beside
	// Sandgate in its pod. An auth header (HeaderCredential) is never sent in plain text to any
	// other address.
	Insecure bool `json:"insecure"`
	// Headers are sent with every export; their values are not secret (use HeaderCredential for
	// an auth header).
	Headers map[string]string `json:"headers"`
	// HeaderCredential sends a credential's value in a header (default Authorization: Bearer
	// {value}), for a Collector or a vendor endpoint that wants a token.
	HeaderCredential *CredentialRef `json:"header_credential"`
	// TLS verifies the Collector against a CA and presents a client certificate.
	TLS *ClientTLS `json:"tls"`
	// Timeout bounds one export request. Default: $OTEL_EXPORTER_OTLP_LOGS_TIMEOUT, else
	// $OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds), else 10s.
	Timeout Duration `json:"timeout"`
	// Batch is the most events sent in one request, and so what the exporter holds in memory
	// (the file is its queue). Default 256.
	Batch int `json:"batch"`
}

// On reports whether the audit log is exported over OTLP.
func (o AuditOTLP) On() bool { return o.Enabled || o.Endpoint != "" }

func (o *AuditOTLP) applyDefaults(c *Config) {
	if o.Batch == 0 {
		o.Batch = 256
	}
	o.HeaderCredential.applyDefaults()
	o.TLS.resolve(c)
}

func (o *AuditOTLP) validate(c *Config, errs *fieldErrors) {
	const f = "audit.otlp"
	switch o.Protocol {
	case "", "grpc", "http/protobuf":
	default:
		errs.add(f+".protocol", "%q is not grpc or http/protobuf", o.Protocol)
	}
	if o.Endpoint != "" {
		u, err := url.Parse(o.Endpoint)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
			errs.add(f+".endpoint", "%q is not an http:// or https:// URL, e.g. https://otel-collector:4318", o.Endpoint)
		case u.Scheme == "http" && !o.Insecure:
			errs.add(f+".endpoint", "%q sends the audit log in plain text: use https://, or set audit.otlp.insecure for a Collector on loopback or in the pod", o.Endpoint)
		case u.Scheme == "http" && o.HeaderCredential != nil && !loopbackHost(u.Hostname()):
			errs.add(f+".header_credential", "would be sent in plain text to %s: use an https:// endpoint", u.Host)
		case u.Scheme == "https" && o.Insecure:
			errs.add(f+".insecure", "contradicts the https:// endpoint %q", o.Endpoint)
		}
	}
	if o.Timeout.D() < 0 || o.Timeout.D() > 5*time.Minute {
		errs.add(f+".timeout", "must be between 0 (unset: the OTEL_EXPORTER_OTLP_TIMEOUT variables, else 10s) and 5m, got %s", o.Timeout.D())
	}
	if o.Batch < 0 || o.Batch > 10000 {
		errs.add(f+".batch", "must be between 1 and 10000 events, got %d", o.Batch)
	}
	for k, v := range o.Headers {
		if !headerToken(k) {
			errs.add(f+".headers", "%q is not an HTTP header name", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			errs.add(fmt.Sprintf("%s.headers.%s", f, k), "must not contain a line break or NUL")
		}
	}
	o.HeaderCredential.validate(c, f+".header_credential", errs)
	o.TLS.validate(f+".tls", errs)
}

// loopbackHost reports whether host is a loopback address or localhost.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
