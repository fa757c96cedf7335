package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientTLS is how Sandgate connects with TLS as a client (to Redis, to an OTLP Collector). Paths
// are relative to the config file's folder.
type ClientTLS struct {
	// CAFile holds the PEM certificates the server's is verified against; empty uses the
	// system's roots.
	CAFile string `json:"ca_file"`
	// CertFile and KeyFile are a client certificate, for servers that require one; set both or
	// neither.
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ServerName is the name the server's certificate must carry; default: the host dialled.
	ServerName string `json:"server_name"`
}

// Config returns the client TLS configuration (nil for a nil t): the server is verified against
// CAFile (or the system's roots), under ServerName when set; TLS 1.2 at least. Errors name the
// fields under field ("redis.tls").
func (t *ClientTLS) Config(field string) (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", field, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file: %s holds no PEM certificate", field, t.CAFile)
		}
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file, %s.key_file: %w", field, field, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// resolve makes the paths relative to the config file's folder.
func (t *ClientTLS) resolve(c *Config) {
	if t != nil {
		t.CAFile, t.CertFile, t.KeyFile = c.Path(t.CAFile), c.Path(t.CertFile), c.Path(t.KeyFile)
	}
}

// validate checks the certificate pair is complete (the files are CheckFiles').
func (t *ClientTLS) validate(field string, errs *fieldErrors) {
	if t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		errs.add(field+".cert_file", "set both %s.cert_file and %s.key_file, or neither", field, field)
	}
}

// checkFiles checks that the files named can be read.
func (t *ClientTLS) checkFiles(field string, errs *fieldErrors) {
	if t == nil {
		return
	}
	for _, f := range [][2]string{{field + ".ca_file", t.CAFile}, {field + ".cert_file", t.CertFile}, {field + ".key_file", t.KeyFile}} {
		if f[1] != "" {
			checkReadableFile(errs, f[0], f[1])
		}
	}
}
