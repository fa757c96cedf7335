package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeArgumentsKeepsNumbersAsWritten(t *testing.T) {
	args, err := decodeArguments(json.RawMessage(`{"n":9007199254740993,"f":1.50,"s":"x"}`))
	require.NoError(t, err)
	assert.Equal(t, json.Number("9007199254740993"), args["n"])
	assert.Equal(t, json.Number("1.50"), args["f"])
	assert.Equal(t, "x", args["s"])
	args, err = decodeArguments(nil)
	require.NoError(t, err)
	assert.Nil(t, args, "a call without arguments has none")
}

// freshArgs decodes raw as decodeArguments did before its decoders were reused: a new
// decoder for every call.
func freshArgs(raw []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var args map[string]any
	err := d.Decode(&args)
	return args, err
}

// One argsDecoder reads call after call exactly as a fresh decoder reads each: the same
// arguments, the same error, whatever came before (a failure, bytes after a value, a value
// that is not an object).
func TestArgsDecoderAgreesWithAFreshOne(t *testing.T) {
	inputs := []string{`{"a":1}`, `{"n":9007199254740993,"f":1.50,"s":"x","o":{"d":[1,{"e":null}]}}`, `{}`,
		`{"a":1} `, `{"a":1}{"b":2}`, `{"a":`, `[1,2]`, `5`, `"s"`, `null`, `{"a":"\u00e9"}`, `{"x":true}`, `{"a":1}x`}
	for _, first := range inputs {
		for _, second := range inputs {
			d := newArgsDecoder()
			for _, raw := range []string{first, second, `{"k":"v"}`} {
				if !d.ok {
					d = newArgsDecoder() // decodeArguments takes another from the pool
				}
				got, gotErr := d.decode([]byte(raw))
				want, wantErr := freshArgs([]byte(raw))
				require.Equal(t, wantErr == nil, gotErr == nil, "%q after %q: %v / %v", raw, first, gotErr, wantErr)
				if wantErr != nil {
					assert.Equal(t, wantErr.Error(), gotErr.Error(), "%q after %q", raw, first)
					continue
				}
				assert.Equal(t, want, got, "%q after %q", raw, first)
			}
		}
	}
}

// FuzzArgsDecoder holds a reused argsDecoder to a fresh json.Decoder on any two inputs in turn.
func FuzzArgsDecoder(f *testing.F) {
	f.Add([]byte(`{"a":1}`), []byte(`{"b":[1.0,2e3]}`))
	f.Add([]byte(`{"a":1} `), []byte(`{"b":"\ud83d\ude00"}`))
	f.Add([]byte(`{"a":`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		d := newArgsDecoder()
		for _, raw := range [][]byte{a, b} {
			if !d.ok {
				d = newArgsDecoder()
			}
			got, gotErr := d.decode(raw)
			want, wantErr := freshArgs(raw)
			if (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
				t.Fatalf("%q: error %v, a fresh decoder's %v", raw, gotErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: %#v, a fresh decoder's %#v", raw, got, want)
			}
		}
	})
}

// BenchmarkDecodeArguments reads a tools/call's arguments for policy with the pool's decoders
// and, for comparison, with a fresh decoder each time (as before the pool).
func BenchmarkDecodeArguments(b *testing.B) {
	raw := json.RawMessage(`{"owner":"acme","repo":"api","n":42,"labels":["ci"]}`)
	for _, bc := range []struct {
		name string
		read func() (map[string]any, error)
	}{
		{"pooled", func() (map[string]any, error) { return decodeArguments(raw) }},
		{"fresh-decoder", func() (map[string]any, error) { return freshArgs(raw) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
