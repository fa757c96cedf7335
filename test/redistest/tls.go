package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are PEM files made for one test: a CA, a server certificate it signed (for 127.0.0.1
// and localhost) and a client certificate it signed.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// StartTLS launches redis-server that speaks only TLS (--port 0 --tls-port P) with a certificate
// from a CA made for the test; clients may present a certificate (tls-auth-clients optional). The
// returned files let a client verify the server. The server is killed when the test ends.
func StartTLS(t testing.TB) (*Server, TLSFiles) {
	t.Helper()
	files := MakeTLSFiles(t)
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(files.CA)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("redistest: read test CA: %v", err)
	}
	s := startServer(t, "redis-server", []string{
		"--tls-cert-file", files.ServerCert, "--tls-key-file", files.ServerKey,
		"--tls-ca-cert-file", files.CA, "--tls-auth-clients", "optional",
	}, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	return s, files
}

// MakeTLSFiles writes a fresh CA and a server and a client certificate into a temporary folder.
func MakeTLSFiles(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newKey(t), &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caCert, caCert, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("redistest: make CA: %v", err)
	}
	if caCert, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatalf("redistest: parse CA: %v", err)
	}
	f := TLSFiles{CA: writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER)}
	f.ServerCert, f.ServerKey = leaf(t, dir, "server", caCert, caKey, x509.ExtKeyUsageServerAuth)
	f.ClientCert, f.ClientKey = leaf(t, dir, "client", caCert, caKey, x509.ExtKeyUsageClientAuth)
	return f
}

func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (cert, key string) {
	t.Helper()
	k := newKey(t)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "redistest " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatalf("redistest: make %s certificate: %v", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatalf("redistest: encode %s key: %v", name, err)
	}
	return writePEM(t, dir, name+".pem", "CERTIFICATE", der), writePEM(t, dir, name+"-key.pem", "EC PRIVATE KEY", keyDER)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("redistest: generate key: %v", err)
	}
	return k
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return p
}
