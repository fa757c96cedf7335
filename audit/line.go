package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
)

// hashKey starts the last member of every line; the 64 hex digits of the hash and the closing
// brace follow it.
const hashKey = `,"hash":"`

const hashHexLen = 2 * sha256.Size

// emptyHashSuffix ends the canonical form of a line (see the package documentation).
const emptyHashSuffix = `,"hash":""}`

// ParseLine decodes one log line (without its newline) into an Event. It checks that the line is
// a JSON object in the writer's form, ending with a "hash" member of 64 lowercase hex digits; it
// does not check that the hash is right (Verify does).
func ParseLine(line []byte) (Event, error) {
	var ev Event
	stored, err := storedHash(line)
	if err != nil {
		return ev, err
	}
	if err := json.Unmarshal(line, &ev); err != nil {
		return ev, fmt.Errorf("decode event: %w", err)
	}
	if ev.Hash != stored {
		// A safety net: with valid JSON the suffix is always the object's last member.
		return ev, errors.New(`the "hash" member is not the last one`)
	}
	return ev, nil
}

// prevHashKey starts the member before "hash" in the writer's form.
const prevHashKey = `,"prev_hash":"`

// linkedHashes reads the chain members of a line in the writer's form, which ends with
//
//	,"prev_hash":"<64 hex digits or nothing>","hash":"<64 hex digits>"}
//
// It returns the prev_hash and the stored hash; chainHash.matches recomputes the hash. Reading
// bytes rather than decoding keeps Verify fast and independent of the other fields.
func linkedHashes(line []byte) (prev, stored string, err error) {
	stored, err = storedHash(line)
	if err != nil {
		return "", "", err
	}
	rest := line[:len(line)-len(hashKey)-hashHexLen-2] // up to the closing quote of prev_hash
	if len(rest) == 0 || rest[len(rest)-1] != '"' {
		return "", "", errors.New(`"prev_hash" does not come right before "hash"`)
	}
	rest = rest[:len(rest)-1]
	switch {
	case bytes.HasSuffix(rest, []byte(prevHashKey)):
		return "", stored, nil
	case len(rest) >= hashHexLen+len(prevHashKey) &&
		bytes.Equal(rest[len(rest)-hashHexLen-len(prevHashKey):len(rest)-hashHexLen], []byte(prevHashKey)) &&
		isLowerHex(rest[len(rest)-hashHexLen:]):
		return string(rest[len(rest)-hashHexLen:]), stored, nil
	}
	return "", "", errors.New(`"prev_hash" does not come right before "hash" with 64 hex digits or none`)
}

// storedHash returns the hex digits of the line's trailing "hash" member.
func storedHash(line []byte) (string, error) {
	n := len(line)
	if n == 0 {
		return "", errors.New("empty line")
	}
	if line[0] != '{' {
		return "", errors.New("not a JSON object")
	}
	if n < len(hashKey)+hashHexLen+2 || line[n-1] != '}' || line[n-2] != '"' {
		return "", errors.New(`does not end with a "hash" member`)
	}
	digits := line[n-2-hashHexLen : n-2]
	if !bytes.Equal(line[n-2-hashHexLen-len(hashKey):n-2-hashHexLen], []byte(hashKey)) {
		return "", errors.New(`does not end with a "hash" member of 64 hex digits`)
	}
	if !isLowerHex(digits) {
		return "", errors.New(`"hash" is not 64 lowercase hex digits`)
	}
	return string(digits), nil
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
