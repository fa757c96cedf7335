package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/atomicfile"
	"github.com/sandgate/sandgate/internal/jsonenc"
)

// Checkpoint is a signed statement about the log: its first Count lines end with the line whose
// hash is LastHash, chained with Chain. The writer appends one to the log every so many events,
// every so often and on Close, and hands a copy to CheckpointConfig.Published so it can be kept
// elsewhere (the process log): a copy out of reach of whoever can rewrite the files is what
// reveals a truncated or replaced log.
//
// In the log a checkpoint is one chained line:
//
//	{"id":"…","time":"…","kind":"audit.checkpoint","checkpoint":{"chain":"hmac-sha256",
//	 "count":1000,"last_hash":"<hex>","time":"<RFC 3339>","key_id":"<hex>","signature":"<base64>"},
//	 "prev_hash":"<hex>","hash":"<hex>"}
//
// Count counts every line before the checkpoint (call events and the writer's own records), from
// the start of the log across rotated files, so LastHash equals the checkpoint line's prev_hash.
type Checkpoint struct {
	Chain     string    `json:"chain"`
	Count     uint64    `json:"count"`
	LastHash  string    `json:"last_hash"`
	Time      time.Time `json:"time"`
	KeyID     string    `json:"key_id"`
	Signature string    `json:"signature"`
}

// signedBytes is the canonical encoding the signature covers: fixed field order, one field a
// line, values that cannot hold a newline (checked by validate).
func (c *Checkpoint) signedBytes() []byte {
	var b []byte
	b = append(b, "sandgate audit checkpoint v1\n"...)
	b = append(b, "chain="+c.Chain+"\n"...)
	b = append(b, "count="+strconv.FormatUint(c.Count, 10)+"\n"...)
	b = append(b, "last_hash="+c.LastHash+"\n"...)
	b = append(b, "time="+c.Time.UTC().Format(time.RFC3339Nano)+"\n"...)
	b = append(b, "key_id="+c.KeyID+"\n"...)
	return b
}

// validate checks the form of the fields (not the signature).
func (c *Checkpoint) validate() error {
	switch {
	case c.Chain != ChainSHA256 && c.Chain != ChainHMACSHA256:
		return fmt.Errorf("checkpoint chain %q is not %s or %s", c.Chain, ChainSHA256, ChainHMACSHA256)
	case c.Count > 0 && (len(c.LastHash) != hashHexLen || !isLowerHex([]byte(c.LastHash))):
		return errors.New("checkpoint last_hash is not 64 lowercase hex digits")
	case c.Count == 0 && c.LastHash != "":
		return errors.New("checkpoint counts no line but has a last_hash")
	case c.KeyID == "" || !isLowerHex([]byte(c.KeyID)):
		return errors.New("checkpoint key_id is not lowercase hex")
	case c.Signature == "":
		return errors.New("checkpoint has no signature")
	}
	return nil
}

// CheckSignature verifies the checkpoint's signature with pub, and that it names pub's key ID.
func (c *Checkpoint) CheckSignature(pub ed25519.PublicKey) error {
	if err := c.validate(); err != nil {
		return err
	}
	if want := PublicKeyID(pub); c.KeyID != want {
		return fmt.Errorf("checkpoint is signed with key id %s, not with the given public key (id %s)", c.KeyID, want)
	}
	sig, err := base64.StdEncoding.DecodeString(c.Signature)
	if err != nil || !ed25519.Verify(pub, c.signedBytes(), sig) {
		return errors.New("checkpoint signature does not verify: the checkpoint was altered or forged")
	}
	return nil
}

// LogValue writes the checkpoint as a group, so that a JSON process log holds it in the form
// ParseCheckpoints reads back.
func (c Checkpoint) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("chain", c.Chain),
		slog.Uint64("count", c.Count),
		slog.String("last_hash", c.LastHash),
		slog.String("time", c.Time.UTC().Format(time.RFC3339Nano)),
		slog.String("key_id", c.KeyID),
		slog.String("signature", c.Signature),
	)
}

// signCheckpoint fills in KeyID and Signature.
func signCheckpoint(c *Checkpoint, key ed25519.PrivateKey) {
	c.KeyID = PublicKeyID(key.Public().(ed25519.PublicKey))
	c.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(key, c.signedBytes()))
}

// PublicKeyID is the fingerprint of a checkpoint public key: the first 8 bytes of the SHA-256 of
// its PKIX (SubjectPublicKeyInfo) DER encoding, in hex.
func PublicKeyID(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:8])
}

// appendCheckpointLine appends the canonical form of a checkpoint record (hash empty).
func appendCheckpointLine(b []byte, id string, c *Checkpoint, prev string) []byte {
	b = append(b, `{"id":`...)
	b = jsonenc.AppendString(b, id)
	b = append(b, `,"time":"`...)
	b = c.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","kind":"`+KindCheckpoint+`","checkpoint":{"chain":`...)
	b = jsonenc.AppendString(b, c.Chain)
	b = append(b, `,"count":`...)
	b = strconv.AppendUint(b, c.Count, 10)
	b = append(b, `,"last_hash":`...)
	b = jsonenc.AppendString(b, c.LastHash)
	b = append(b, `,"time":"`...)
	b = c.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","key_id":`...)
	b = jsonenc.AppendString(b, c.KeyID)
	b = append(b, `,"signature":`...)
	b = jsonenc.AppendString(b, c.Signature)
	b = append(b, `},"prev_hash":`...)
	b = jsonenc.AppendString(b, prev)
	return append(b, emptyHashSuffix...)
}

// chainMarker is the body of a KindChain record.
type chainMarker struct {
	Alg   string `json:"alg"`
	KeyID string `json:"key_id"`
}

// appendChainLine appends the canonical form of a KindChain record (hash empty).
func appendChainLine(b []byte, id string, t time.Time, c *chainHash, prev string) []byte {
	b = append(b, `{"id":`...)
	b = jsonenc.AppendString(b, id)
	b = append(b, `,"time":"`...)
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","kind":"`+KindChain+`","chain":{"alg":`...)
	b = jsonenc.AppendString(b, c.alg)
	b = append(b, `,"key_id":`...)
	b = jsonenc.AppendString(b, c.keyID)
	b = append(b, `},"prev_hash":`...)
	b = jsonenc.AppendString(b, prev)
	return append(b, emptyHashSuffix...)
}

// record is what Verify and the sink decode of the writer's own records.
type record struct {
	Kind       string       `json:"kind"`
	Chain      *chainMarker `json:"chain"`
	Checkpoint *Checkpoint  `json:"checkpoint"`
	Recovered  *Recovery    `json:"recovered"`
}

func parseRecord(line []byte, kind string) (record, error) {
	var r record
	if err := json.Unmarshal(line, &r); err != nil {
		return r, err
	}
	switch {
	case r.Kind != kind:
		return r, fmt.Errorf(`"kind" is %q, expected %q`, r.Kind, kind)
	case kind == KindChain && r.Chain == nil:
		return r, errors.New(`chain record without "chain"`)
	case kind == KindCheckpoint && r.Checkpoint == nil:
		return r, errors.New(`checkpoint record without "checkpoint"`)
	case kind == KindCheckpoint:
		return r, r.Checkpoint.validate()
	case kind == KindRecovered && r.Recovered == nil:
		return r, errors.New(`recovered record without "recovered"`)
	case kind != KindChain && kind != KindRecovered:
		return r, fmt.Errorf("unknown record kind %q", kind)
	}
	return r, nil
}

// ParseCheckpoints reads checkpoints kept outside the log: one JSON object a line, either a log
// line or process log line with a "checkpoint" member (the writer's record, or slog's JSON output
// of CheckpointConfig.Published) or a bare checkpoint object. Other lines (text, other log
// messages) are skipped; finding no checkpoint at all is an error.
func ParseCheckpoints(r io.Reader) ([]Checkpoint, error) {
	var out []Checkpoint
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineSize)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var holder struct {
			Checkpoint json.RawMessage `json:"checkpoint"`
			Signature  string          `json:"signature"`
		}
		if json.Unmarshal(line, &holder) != nil {
			continue
		}
		body := []byte(holder.Checkpoint)
		if len(body) == 0 {
			if holder.Signature == "" {
				continue
			}
			body = line
		}
		var c Checkpoint
		if err := json.Unmarshal(body, &c); err != nil {
			return nil, fmt.Errorf("checkpoint on line %d: %w", n, err)
		}
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("checkpoint on line %d: %w", n, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("no checkpoint found (want JSON lines with a \"checkpoint\" member, or checkpoint objects)")
	}
	return out, nil
}

// ParseSigningKey reads an Ed25519 private key in PEM (PKCS #8, "PRIVATE KEY").
func ParseSigningKey(pemBytes []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New(`checkpoint signing key: want a PEM "PRIVATE KEY" block (PKCS #8; sandgate audit keygen writes one)`)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("checkpoint signing key: %w", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("checkpoint signing key: want an Ed25519 key, got %T", k)
	}
	return ek, nil
}

// ParsePublicKey reads an Ed25519 public key in PEM (PKIX, "PUBLIC KEY").
func ParsePublicKey(pemBytes []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New(`checkpoint public key: want a PEM "PUBLIC KEY" block (sandgate audit keygen writes one)`)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("checkpoint public key: %w", err)
	}
	ek, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("checkpoint public key: want an Ed25519 key, got %T", k)
	}
	return ek, nil
}

// Files written by GenerateKeys.
const (
	SigningKeyFile = "checkpoint.key"
	PublicKeyFile  = "checkpoint.pub"
	ChainKeyFile   = "chain.key"
)

// GenerateKeys writes new audit keys to dir (created with mode 0700): the checkpoint signing key
// (Ed25519, PEM PKCS #8, mode 0600), its public key (PEM, mode 0644) and a chain key (32 random
// bytes in base64, mode 0600; the base64 text is the key). It refuses to replace existing files
// unless force is set. It returns the paths in that order.
func GenerateKeys(dir string, force bool) ([]string, error) {
	paths := []string{filepath.Join(dir, SigningKeyFile), filepath.Join(dir, PublicKeyFile), filepath.Join(dir, ChainKeyFile)}
	if !force {
		for _, p := range paths {
			if _, err := os.Stat(p); err == nil {
				return nil, fmt.Errorf("create audit keys: %s exists (pass --force to replace it; logs keyed or signed with the old keys then need the old keys to verify)", p)
			}
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("create checkpoint key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint public key: %w", err)
	}
	chain := make([]byte, 32)
	if _, err := rand.Read(chain); err != nil {
		return nil, fmt.Errorf("create chain key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create audit key dir: %w", err)
	}
	contents := [][]byte{
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}),
		[]byte(base64.StdEncoding.EncodeToString(chain) + "\n"),
	}
	modes := []os.FileMode{0o600, 0o644, 0o600}
	for i, p := range paths {
		if err := atomicfile.Write(p, contents[i], modes[i]); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// ReadKeyFile reads a chain key from a file the way the credential store reads a credential
// file: the bytes with trailing newlines removed.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read chain key: %w", err)
	}
	b = []byte(strings.TrimRight(string(b), "\r\n"))
	if err := checkChainKey(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}
