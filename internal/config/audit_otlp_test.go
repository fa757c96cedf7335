package config_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestAuditOTLPErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc, wantErr string
	}{
		{"unknown protocol", "audit: {otlp: {endpoint: 'https://c:4318', protocol: http/json}}",
			`audit.otlp.protocol: "http/json" is not grpc or http/protobuf`},
		{"endpoint that is not a URL", "audit: {otlp: {endpoint: 'collector:4317'}}", "audit.otlp.endpoint: \"collector:4317\" is not an http:// or https:// URL"},
		{"plain text without insecure", "audit: {otlp: {endpoint: 'http://collector:4318'}}", "audit.otlp.endpoint: \"http://collector:4318\" sends the audit log in plain text"},
		{"an auth header in plain text off loopback",
			"credentials: [{name: tok, env: TOK}]\naudit: {otlp: {endpoint: 'http://collector:4318', insecure: true, header_credential: {name: tok}}}",
			"audit.otlp.header_credential: would be sent in plain text to collector:4318"},
		{"insecure with https", "audit: {otlp: {endpoint: 'https://c:4318', insecure: true}}", "audit.otlp.insecure: contradicts the https:// endpoint"},
		{"header credential that does not exist", "audit: {otlp: {endpoint: 'https://c:4318', header_credential: {name: nope}}}",
			`audit.otlp.header_credential.name: no credential named "nope"`},
		{"header that is not a header name", "audit: {otlp: {endpoint: 'https://c:4318', headers: {'a b': x}}}", `audit.otlp.headers: "a b" is not an HTTP header name`},
		{"client certificate without its key", "audit: {otlp: {endpoint: 'https://c:4318', tls: {cert_file: c.pem}}}",
			"audit.otlp.tls.cert_file: set both audit.otlp.tls.cert_file and audit.otlp.tls.key_file"},
		{"batch too large", "audit: {otlp: {enabled: true, batch: 100000}}", "audit.otlp.batch: must be between 1 and 10000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestAuditOTLPDefaults(t *testing.T) {
	c, err := config.Parse([]byte("audit: {}"), "/etc/sandgate")
	require.NoError(t, err)
	assert.False(t, c.Audit.OTLP.On(), "off unless asked for")

	c, err = config.Parse([]byte(`credentials: [{name: tok, env: TOK}]
audit: {otlp: {endpoint: 'http://127.0.0.1:4318', insecure: true, header_credential: {name: tok}, tls: {ca_file: ca.pem}}}`), "/etc/sandgate")
	require.NoError(t, err, "an auth header may go in plain text to loopback")
	o := c.Audit.OTLP
	assert.True(t, o.On())
	assert.Zero(t, o.Timeout.D(), "unset: the exporter reads OTEL_EXPORTER_OTLP_TIMEOUT, else 10s")
	assert.Equal(t, 256, o.Batch)
	assert.Equal(t, "Authorization", o.HeaderCredential.Header)
	assert.Equal(t, "Bearer {value}", o.HeaderCredential.Format)
	assert.Equal(t, "/etc/sandgate/ca.pem", o.TLS.CAFile)

	c, err = config.Parse([]byte("audit: {otlp: {enabled: true}}"), "/etc/sandgate")
	require.NoError(t, err, "enabled without an endpoint: the OTEL_EXPORTER_OTLP_* variables say where")
	assert.True(t, c.Audit.OTLP.On())
}
