package audit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
)

// Chain algorithms: how a line's hash is computed from its canonical form.
const (
	// ChainSHA256 is the plain chain: anyone who can write the files can recompute it.
	ChainSHA256 = "sha256"
	// ChainHMACSHA256 is the keyed chain: recomputing it needs the chain key.
	ChainHMACSHA256 = "hmac-sha256"
)

// Kinds of the writer's own records. They are chained lines like call events, but they are not
// calls: Query skips them and Verify counts them apart. Record refuses every kind in the "audit."
// family so that no caller can write one.
const (
	// KindChain starts the keyed part of a log: it names the algorithm and the key's ID, and is
	// itself hashed with that key. A keyed writer writes one before its first line.
	KindChain = "audit.chain"
	// KindCheckpoint is a signed statement of how many lines the log has and the hash of the last.
	KindCheckpoint = "audit.checkpoint"
)

const reservedKindPrefix = "audit."

// MinChainKeyLen is the shortest chain key accepted, in bytes.
const MinChainKeyLen = 32

// ChainKeyID identifies a chain key without revealing it: the first 8 bytes of
// HMAC-SHA-256(key, "sandgate audit chain key id"), in hex. Verify uses it to tell a wrong key
// from an edited line.
func ChainKeyID(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("sandgate audit chain key id"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// checkChainKey refuses a key too short to be a secret.
func checkChainKey(key []byte) error {
	if len(key) < MinChainKeyLen {
		return fmt.Errorf("chain key has %d bytes, want at least %d (for example: openssl rand -base64 32)", len(key), MinChainKeyLen)
	}
	return nil
}

// chainHash computes line hashes with one algorithm. It reuses its HMAC state and scratch
// buffer, so hashing a line allocates nothing, as with plain SHA-256. Not safe for concurrent use.
type chainHash struct {
	alg   string
	keyID string
	mac   hash.Hash // nil for ChainSHA256
	sum   []byte
}

var plainChain = &chainHash{alg: ChainSHA256}

func newKeyedChain(key []byte) *chainHash {
	return &chainHash{
		alg:   ChainHMACSHA256,
		keyID: ChainKeyID(key),
		mac:   hmac.New(sha256.New, key),
		sum:   make([]byte, 0, sha256.Size),
	}
}

// sum256 writes the hash of the canonical form, given as prefix followed by suffix, into out.
func (c *chainHash) sum256(out *[sha256.Size]byte, prefix, suffix []byte) {
	if c.mac == nil {
		if suffix == nil {
			*out = sha256.Sum256(prefix)
			return
		}
		h := sha256.New()
		h.Write(prefix)
		h.Write(suffix)
		h.Sum(out[:0])
		return
	}
	c.mac.Reset()
	c.mac.Write(prefix)
	if suffix != nil {
		c.mac.Write(suffix)
	}
	c.sum = c.mac.Sum(c.sum[:0])
	copy(out[:], c.sum)
}

// seal turns the canonical form at the end of buf (from start, ending with emptyHashSuffix and no
// newline) into the final line by filling in its hash, and returns the grown buffer and the hash.
func (c *chainHash) seal(buf []byte, start int) ([]byte, string, error) {
	canonical := buf[start:]
	if !bytes.HasSuffix(canonical, []byte(emptyHashSuffix)) {
		// Event gained a field after Hash, or Hash gained omitempty: the chain format would break.
		return buf, "", errors.New(`encoded line does not end with an empty "hash" member`)
	}
	var sum [sha256.Size]byte
	c.sum256(&sum, canonical, nil)
	var digits [hashHexLen]byte
	hex.Encode(digits[:], sum[:])
	buf = buf[:len(buf)-2] // drop `"}`, keep the opening quote of the value
	buf = append(buf, digits[:]...)
	buf = append(buf, '"', '}')
	return buf, string(digits[:]), nil
}

// lineSum recomputes the hash of a line in the writer's form (whose stored hash was checked to
// be 64 hex digits) from its canonical form, and says whether it equals the stored one.
func (c *chainHash) matches(line []byte, stored string) bool {
	prefix := line[:len(line)-len(hashKey)-hashHexLen-2]
	var sum [sha256.Size]byte
	c.sum256(&sum, prefix, []byte(emptyHashSuffix))
	var digits [hashHexLen]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:]) == stored
}

// lineKind returns the value of the line's "kind" member when the line is in the writer's form
// (id, time, kind first), or "". It reads bytes only, for Verify and Query to tell the writer's
// records from call events without decoding every line.
func lineKind(line []byte) string {
	const key = `","kind":"`
	head := line[:min(len(line), 160)]
	i := bytes.Index(head, []byte(key))
	if i < 0 {
		return ""
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// isRecordKind reports whether kind is one of the writer's own records rather than a call.
func isRecordKind(k Kind) bool {
	kind := string(k)
	return len(kind) > len(reservedKindPrefix) && kind[:len(reservedKindPrefix)] == reservedKindPrefix
}
