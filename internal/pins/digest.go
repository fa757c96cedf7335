// Package pins records what an MCP upstream's tool definitions were when a person reviewed
// them, so that a definition changed afterwards (a "rug pull": a new description telling the
// agent to do something else, a schema asking for more) is noticed instead of served.
//
// A pin is the SHA-256 of a tool's definition in canonical JSON: its name, description,
// inputSchema, outputSchema and annotations (other members, such as _meta, title and icons,
// are not part of it), plus a digest of each of those parts and the description's text, so
// that a difference can say what changed. The pins live in one file in the policy folder,
// FileName, reviewed in a pull request like the policies; `sandgate policy pin` writes it.
//
// The gateway checks every tool an upstream lists (Check): a pinned tool whose definition
// differs is hidden from every sandbox until it is pinned again; a tool with no pin follows
// gateway.unpinned (allow, the default, or hide).
package pins

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// The parts of a definition a pin covers, as MCP names them.
const (
	PartName         = "name"
	PartDescription  = "description"
	PartInputSchema  = "inputSchema"
	PartOutputSchema = "outputSchema"
	PartAnnotations  = "annotations"
)

// parts in the order of a canonical JSON object's keys.
var parts = []string{PartAnnotations, PartDescription, PartInputSchema, PartName, PartOutputSchema}

// Pin is what is recorded of one tool's definition.
type Pin struct {
	// Digest is "sha256:" and the hex SHA-256 of the definition's canonical JSON.
	Digest string `json:"digest"`
	// Description is the description's text, so that a change shows what it was.
	Description string `json:"description,omitempty"`
	// InputSchema, OutputSchema and Annotations are the digests of those parts ("" when the
	// definition has none).
	InputSchema  string `json:"input_schema,omitempty"`
	OutputSchema string `json:"output_schema,omitempty"`
	Annotations  string `json:"annotations,omitempty"`
}

// Definition is a tool's definition as an upstream listed it, the parts a pin covers.
type Definition struct {
	Name        string
	Description string
	// The JSON parts, canonical; nil when absent.
	InputSchema, OutputSchema, Annotations []byte
}

// MaxDefinitionBytes bounds one tool definition Parse reads.
const MaxDefinitionBytes = 4 << 20

// ParseDefinition reads one entry of a tools/list result (a JSON object). A definition that is
// not an object, has no string name, repeats a key anywhere or is not valid UTF-8 JSON is an
// error: it cannot be pinned unambiguously.
func ParseDefinition(raw []byte) (*Definition, error) {
	if len(raw) > MaxDefinitionBytes {
		return nil, fmt.Errorf("tool definition of %d bytes is over the %d-byte bound", len(raw), MaxDefinitionBytes)
	}
	if !utf8.Valid(raw) {
		return nil, errors.New("tool definition is not valid UTF-8")
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil || members == nil {
		return nil, errors.New("tool definition is not a JSON object")
	}
	d := &Definition{}
	if err := json.Unmarshal(members[PartName], &d.Name); err != nil || d.Name == "" {
		return nil, errors.New("tool definition has no name")
	}
	if desc, ok := members[PartDescription]; ok && string(desc) != "null" {
		if err := json.Unmarshal(desc, &d.Description); err != nil {
			return nil, fmt.Errorf("tool %q: description is not a string", d.Name)
		}
	}
	for _, p := range []struct {
		key string
		dst *[]byte
	}{{PartInputSchema, &d.InputSchema}, {PartOutputSchema, &d.OutputSchema}, {PartAnnotations, &d.Annotations}} {
		v, ok := members[p.key]
		if !ok || string(v) == "null" {
			continue
		}
		c, err := Canonical(v)
		if err != nil {
			return nil, fmt.Errorf("tool %q: %s: %w", d.Name, p.key, err)
		}
		*p.dst = c
	}
	// A duplicate key at the top is invisible to the map above: check the whole.
	if _, err := Canonical(raw); err != nil {
		return nil, fmt.Errorf("tool %q: %w", d.Name, err)
	}
	return d, nil
}

// Pin computes the definition's pin.
func (d *Definition) Pin() Pin {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	for _, p := range parts {
		var v []byte
		switch p {
		case PartName:
			v = jsonString(d.Name)
		case PartDescription:
			if d.Description != "" {
				v = jsonString(d.Description)
			}
		case PartInputSchema:
			v = d.InputSchema
		case PartOutputSchema:
			v = d.OutputSchema
		case PartAnnotations:
			v = d.Annotations
		}
		if v == nil {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.Write(jsonString(p))
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return Pin{Digest: digest(b.Bytes()), Description: d.Description,
		InputSchema: digestOf(d.InputSchema), OutputSchema: digestOf(d.OutputSchema), Annotations: digestOf(d.Annotations)}
}

// PinOf is ParseDefinition(raw).Pin().
func PinOf(raw []byte) (Pin, error) {
	d, err := ParseDefinition(raw)
	if err != nil {
		return Pin{}, err
	}
	return d.Pin(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func digestOf(b []byte) string {
	if b == nil {
		return ""
	}
	return digest(b)
}

func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// Canonical is the JSON value raw in canonical form: objects with their keys sorted (by their
// UTF-16 code units, as RFC 8785), no insignificant whitespace, strings escaped only where JSON
// requires, numbers as written. A key repeated in an object is an error: two readers of it
// could see two different definitions.
func Canonical(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b bytes.Buffer
	if err := canonicalValue(dec, &b, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON value")
	}
	return b.Bytes(), nil
}

// maxDepth bounds the nesting Canonical follows.
const maxDepth = 64

func canonicalValue(dec *json.Decoder, b *bytes.Buffer, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return canonicalArray(dec, b, depth)
		}
		if t == '{' {
			return canonicalObject(dec, b, depth)
		}
		return fmt.Errorf("unexpected %q", t)
	case string:
		b.Write(jsonString(t))
	case json.Number:
		b.WriteString(t.String())
	case bool:
		fmt.Fprint(b, t)
	case nil:
		b.WriteString("null")
	}
	return nil
}

func canonicalArray(dec *json.Decoder, b *bytes.Buffer, depth int) error {
	b.WriteByte('[')
	for i := 0; dec.More(); i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := canonicalValue(dec, b, depth+1); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	b.WriteByte(']')
	return nil
}

func canonicalObject(dec *json.Decoder, b *bytes.Buffer, depth int) error {
	type member struct {
		key string
		val []byte
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not valid JSON: %w", err)
		}
		key, _ := tok.(string)
		var v bytes.Buffer
		if err := canonicalValue(dec, &v, depth+1); err != nil {
			return err
		}
		members = append(members, member{key, v.Bytes()})
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	slices.SortFunc(members, func(x, y member) int { return compareUTF16(x.key, y.key) })
	b.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if members[i-1].key == m.key {
				return fmt.Errorf("key %q appears twice in one object", m.key)
			}
			b.WriteByte(',')
		}
		b.Write(jsonString(m.key))
		b.WriteByte(':')
		b.Write(m.val)
	}
	b.WriteByte('}')
	return nil
}

// compareUTF16 orders strings by their UTF-16 code units (RFC 8785's key order).
func compareUTF16(a, b string) int {
	ar, br := []rune(a), []rune(b)
	for i := 0; i < len(ar) && i < len(br); i++ {
		if ar[i] == br[i] {
			continue
		}
		return cmpUnits(ar[i], br[i])
	}
	return len(ar) - len(br)
}

func cmpUnits(a, b rune) int {
	unit := func(r rune) rune {
		if r >= 0x10000 {
			return 0xD800 + ((r - 0x10000) >> 10) // the high surrogate decides
		}
		return r
	}
	if ua, ub := unit(a), unit(b); ua != ub {
		return int(ua) - int(ub)
	}
	return int(a) - int(b)
}

// describe names the parts in which two pins differ.
func describe(old, cur Pin) []string {
	var out []string
	if old.Description != cur.Description {
		out = append(out, PartDescription)
	}
	for _, p := range []struct{ name, a, b string }{
		{PartInputSchema, old.InputSchema, cur.InputSchema}, {PartOutputSchema, old.OutputSchema, cur.OutputSchema},
		{PartAnnotations, old.Annotations, cur.Annotations}} {
		if p.a != p.b {
			out = append(out, p.name)
		}
	}
	if len(out) == 0 && old.Digest != cur.Digest {
		out = append(out, "definition") // a pin written by hand, or the name's spelling
	}
	return out
}

// Differences says which parts of the definition differ from the pin, in words:
// "description, inputSchema".
func Differences(old, cur Pin) string { return strings.Join(describe(old, cur), ", ") }
