package pins

import (
	"bytes"
	"testing"
)

// FuzzParse holds the pins file parser to never failing badly: any input is a File or an error,
// and a File written back reads as the same File.
func FuzzParse(f *testing.F) {
	good := "sha256:" + string(bytes.Repeat([]byte("0"), 64))
	f.Add([]byte("tool_pins: {everything: {echo: {digest: " + good + ", description: Returns its message}}}\n"))
	f.Add([]byte("tool_pins: {}\n"))
	f.Add([]byte("# only a comment\n"))
	f.Add([]byte("tool_pins: {u: {t: {digest: " + good + ", input_schema: " + good + "}}}\n"))
	f.Add([]byte("tool_pins: [1, 2]\n"))
	f.Add([]byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			return
		}
		out, err := p.Marshal()
		if err != nil {
			t.Fatalf("a parsed file does not write back: %v", err)
		}
		q, err := Parse(out)
		if err != nil {
			t.Fatalf("a written file does not parse: %v\n%s", err, out)
		}
		if len(p.Tools) != len(q.Tools) {
			t.Fatalf("round trip changed the upstreams: %v != %v", p.Tools, q.Tools)
		}
		for u, tools := range p.Tools {
			for name, pin := range tools {
				if q.Tools[u][name] != pin {
					t.Fatalf("round trip changed %s/%s: %+v != %+v", u, name, pin, q.Tools[u][name])
				}
			}
		}
	})
}

// FuzzCanonical: a canonical form is its own canonical form, and a definition's pin does not
// depend on how its JSON was spelled.
func FuzzCanonical(f *testing.F) {
	f.Add([]byte(echo))
	f.Add([]byte(`{"b":1,"a":[true,null,"\u00e9"],"c":{"y":1e3,"x":-0}}`))
	f.Add([]byte(`"\ud83d\ude00"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Canonical(b)
		if err != nil {
			return
		}
		again, err := Canonical(c)
		if err != nil || !bytes.Equal(c, again) {
			t.Fatalf("canonical form is not stable: %q → %q (%v)", c, again, err)
		}
	})
}
