package jsonenc

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stdJSON is what encoding/json writes for v with HTML escaping off, as the audit log and the
// decision log are read back: the behaviour every function here must reproduce byte for byte.
func stdJSON(t testing.TB, v any) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	return strings.TrimSuffix(b.String(), "\n")
}

func TestAppendStringWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, s := range []string{
		"", "plain", `quote " and backslash \`, "tab\tnewline\nreturn\rbackspace\bformfeed\f",
		"\x00\x01\x1f\x7f", "<html> & 'apostrophe'", "é, 日本, 🙂", "line\u2028para\u2029end",
		"bad \xff utf-8 \xc3", "\xed\xa0\x80 surrogate half", "sk-ant-" + strings.Repeat("a", 300),
	} {
		assert.Equal(t, stdJSON(t, s), string(AppendString(nil, s)), "%q", s)
	}
	assert.Equal(t, `x"ab"`, string(AppendString([]byte("x"), "ab")), "appends to what is there")
}

func TestAppendFloatWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, f := range []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 123.456, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, -1e21,
		1.5e300, math.MaxFloat64, math.SmallestNonzeroFloat64, 5e-324, 12345678901234567890, 0.1 + 0.2} {
		assert.Equal(t, stdJSON(t, f), string(AppendFloat(nil, f)), "%v", f)
	}
}

func TestValidNumberAgreesWithEncodingJSON(t *testing.T) {
	valid := []string{"0", "-0", "1", "-12", "1.5", "0.25", "1e9", "1E+9", "1e-9", "-0.0e0", "123456789012345678901234567890"}
	invalid := []string{"", "-", "01", "1.", ".5", "+1", "1e", "1e+", "0x10", "1_000", "NaN", "Infinity", " 1", "1 ", "--1", "1.5.5", "e5"}
	for _, s := range valid {
		assert.True(t, ValidNumber(s), s)
		_, err := json.Marshal(json.Number(s))
		assert.NoError(t, err, "encoding/json accepts %q too", s)
	}
	for _, s := range invalid {
		assert.False(t, ValidNumber(s), s)
		if s != "" { // encoding/json writes an empty Number as 0
			_, err := json.Marshal(json.Number(s))
			assert.Error(t, err, "encoding/json refuses %q too", s)
		}
	}
}

func TestAppendStringMapWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, m := range []map[string]string{nil, {}, {"a": "1"}, {"team": "platform", "app": "x\"y", "Z": "<>", "é": "\n"},
		{"k0": "", "k1": "", "k2": "", "k3": "", "k4": "", "k5": "", "k6": "", "k7": "", "k8": "", "k9": ""}} {
		assert.Equal(t, stdJSON(t, m), string(AppendStringMap(nil, m)), "%v", m)
	}
}

// The functions allocate nothing beyond the buffer they are given room in: the audit
// sequencer encodes every event of the process with them.
func TestAppendAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 4096)
	m := map[string]string{"team": "platform", "app": "web"}
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendString(buf[:0], "a \"quoted\" string\nwith \xff")
		b = AppendFloat(b, 1.5e-9)
		_ = AppendStringMap(b, m)
	})
	assert.Zero(t, allocs)
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\x00\u2028\xff", "日本"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := AppendString(nil, s)
		if want := stdJSON(t, s); string(got) != want {
			t.Fatalf("AppendString(%q) = %s, encoding/json %s", s, got, want)
		}
		if !utf8.Valid(got) || !json.Valid(got) {
			t.Fatalf("AppendString(%q) = %q is no valid JSON text", s, got)
		}
	})
}

func FuzzAppendFloat(f *testing.F) {
	for _, x := range []float64{0, 1e-7, 1e21, -3.25, math.MaxFloat64} {
		f.Add(math.Float64bits(x))
	}
	f.Fuzz(func(t *testing.T, bits uint64) {
		x := math.Float64frombits(bits)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			t.Skip("not a JSON number")
		}
		if got, want := string(AppendFloat(nil, x)), stdJSON(t, x); got != want {
			t.Fatalf("AppendFloat(%v) = %s, encoding/json %s", x, got, want)
		}
	})
}

func FuzzValidNumber(f *testing.F) {
	for _, s := range []string{"0", "-1.5e+10", "01", "1.", "1e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" {
			return // encoding/json writes an empty Number as 0
		}
		_, err := json.Marshal(json.Number(s))
		if ValidNumber(s) != (err == nil) {
			t.Fatalf("ValidNumber(%q) = %v, encoding/json error %v", s, ValidNumber(s), err)
		}
	})
}
