package proxy

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/atomicfile"
)

// CA file names written by InitCA.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

const (
	leafValidity    = 7 * 24 * time.Hour
	leafRenewBefore = 24 * time.Hour
	leafCacheSize   = 4096
)

// InitCA writes a new ECDSA P-256 CA to dir: ca.crt (mode 0644) and ca.key (mode 0600). It
// refuses to overwrite existing files unless force is set. Sandboxes trust ca.crt (see
// docs/egress-proxy.md); ca.key never leaves Sandgate.
func InitCA(dir string, force bool, now time.Time) (certPath, keyPath string, err error) {
	certPath, keyPath = filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if !force {
		for _, p := range []string{certPath, keyPath} {
			if _, err := os.Stat(p); err == nil {
				return "", "", fmt.Errorf("create CA: %s exists (pass --force to replace it; sandboxes trusting the old CA must be given the new ca.crt)", p)
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("create CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "Sandgate egress CA", Organization: []string{"Sandgate"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", fmt.Errorf("create CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("encode CA key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("create CA dir: %w", err)
	}
	if err := atomicfile.Write(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	if err := atomicfile.Write(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}

// CA signs leaf certificates for intercepted hosts and caches them. All leaves share one
// ECDSA key generated at load, so a new host costs one signature, not a key generation.
type CA struct {
	cert    *x509.Certificate
	certDER []byte
	key     crypto.Signer
	leafKey *ecdsa.PrivateKey
	now     func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// LoadCA reads a CA written by InitCA (or any PEM certificate with an ECDSA, RSA or Ed25519
// PKCS#8/EC/PKCS#1 key). It refuses a key file readable by group or others.
func LoadCA(certPath, keyPath string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certPath, err)
	}
	if st, err := os.Stat(keyPath); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("load CA: key file %s has mode %o; make it 0600 (chmod 600)", keyPath, st.Mode().Perm())
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("load CA: %s is not a CA certificate", certPath)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("load CA: key cannot sign")
	}
	return newCA(cert, pair.Certificate[0], signer)
}

func newCA(cert *x509.Certificate, der []byte, key crypto.Signer) (*CA, error) {
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	return &CA{cert: cert, certDER: der, key: key, leafKey: leafKey, now: time.Now, leaves: map[string]*tls.Certificate{}}, nil
}

// Leaf returns a certificate for host (a DNS name or IP literal), from the cache when one is
// valid for at least another day.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	now := ca.now()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && now.Add(leafRenewBefore).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	pub, err := ca.leafKey.PublicKey.Bytes()
	if err != nil {
		return nil, fmt.Errorf("sign leaf certificate for %s: %w", host, err)
	}
	ski := sha256.Sum256(pub)
	tmpl.SubjectKeyId = ski[:20]
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign leaf certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("sign leaf certificate for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.certDER}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= leafCacheSize {
		for k := range ca.leaves { // evict an arbitrary entry; hosts are a configured, small set
			delete(ca.leaves, k)
			break
		}
	}
	ca.leaves[host] = c
	return c, nil
}

// CertPEM is the CA certificate sandboxes must trust.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.certDER})
}
