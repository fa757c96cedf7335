package audit

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/identity"
)

// jsonEncode is the reference: what the writer used before appendEvent.
func jsonEncode(t testing.TB, e *Event) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(e))
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// fill sets every field reachable from v (strings, numbers, bools, pointers, maps) to s or a
// value derived from it, so a field appendEvent does not write shows up as a difference.
func fill(v reflect.Value, s string, n int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		v.SetBool(n%2 == 1)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(n))
	case reflect.Float64:
		v.SetFloat(float64(n) / 7)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), s, n)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("z"+s), reflect.ValueOf(s))
		m.SetMapIndex(reflect.ValueOf("a"), reflect.ValueOf("1"))
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 1, 2, 3, n, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), s, n+i)
			}
		}
	default:
		panic("fill: add a case for " + v.Kind().String())
	}
}

func TestAppendEventMatchesEncodingJSON(t *testing.T) {
	zero, one := 0, 1
	cases := map[string]Event{
		"zero event": {},
		"every field set": func() Event {
			var e Event
			fill(reflect.ValueOf(&e).Elem(), "v", 3)
			return e
		}(),
		"a typical tool call": {
			ID: "01JDX", Time: time.Date(2026, 11, 30, 0, 0, 0, 123456789, time.UTC), Kind: KindToolsCall,
			Identity: identity.Identity{Namespace: "agents", Sandbox: "s-1", Template: "coder", Labels: map[string]string{}, SourceIP: "10.0.0.7", Known: true},
			Target:   Target{Upstream: "github", Tool: "create_issue", Shown: &zero, Hidden: &one},
			Decision: Decision{Allow: true, Reason: "allowed by policy", PolicyRevision: "r1"},
			Outcome:  Outcome{Status: 200, DurationMS: 0.000123, BytesIn: 10},
			PrevHash: strings.Repeat("a", 64),
		},
		"escapes": {
			ID: "\"\\\b\f\n\r\t\x00\x1f\x7f<>&", Kind: "\u2028\u2029 é 日本 \xff\xfe broken \xe2\x80",
			Identity: identity.Identity{Labels: map[string]string{"k\"ey": "v\nal", "": "", "é": "\x01"}},
			Decision: Decision{Reason: strings.Repeat("reason ", 20)},
		},
		"number formats":     {Outcome: Outcome{Status: -1, DurationMS: 1e21, BytesIn: math.MaxInt64, BytesOut: math.MinInt64, TokensIn: -5, TokensOut: 1}},
		"credential echoed":  {Outcome: Outcome{Status: 200, TokensOut: 3, CredentialEchoed: true}},
		"admitted uncounted": {Limits: LimitsUnavailable, Outcome: Outcome{Status: 200}},
		"tiny duration":      {Outcome: Outcome{DurationMS: 1e-7}},
		"huge duration":      {Outcome: Outcome{DurationMS: -1.5e300}},
		"negative zero":      {Outcome: Outcome{DurationMS: math.Copysign(0, -1)}},
		"year zero":          {Time: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		"year 9999":          {Time: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, checkEncodable(&e))
			assert.Equal(t, string(jsonEncode(t, &e)), string(appendEvent(nil, &e)))
		})
	}
}

func FuzzAppendEvent(f *testing.F) {
	f.Add("id", "kind", "sandbox", "label", "reason", "/v1/messages", 200, 1.5, int64(10))
	f.Add("\x00\"\\", "\u2028", "\xff", "é", "", "", 0, 1e-9, int64(-1))
	f.Add("", "", "", "", "", "", -1, 1e22, int64(0))
	f.Fuzz(func(t *testing.T, id, kind, sandbox, label, reason, path string, status int, dur float64, n int64) {
		if math.IsNaN(dur) || math.IsInf(dur, 0) {
			return // checkEncodable refuses these before they reach the encoder
		}
		e := Event{
			ID: id, Time: time.Unix(0, n).UTC(), Kind: Kind(kind),
			Identity: identity.Identity{Sandbox: sandbox, Labels: map[string]string{label: sandbox, "x": label}, Known: n%2 == 0},
			Target:   Target{Path: path, Model: label, Shown: &status},
			Decision: Decision{Reason: reason},
			Outcome:  Outcome{Status: status, DurationMS: dur, BytesIn: n, TokensOut: n / 3, CredentialEchoed: n%3 == 0},
			TraceID:  path,
		}
		if checkEncodable(&e) != nil {
			return
		}
		want := jsonEncode(t, &e)
		got := appendEvent([]byte("prefix"), &e)
		if !bytes.Equal(want, got[len("prefix"):]) {
			t.Fatalf("appendEvent differs from encoding/json\n got: %s\nwant: %s", got[len("prefix"):], want)
		}
	})
}

func BenchmarkEncodeEvent(b *testing.B) {
	e := Event{
		ID: "01JDXAMPLE0000000000000000", Time: time.Now().UTC(), Kind: KindHTTPRequest,
		Identity:   identity.Identity{Namespace: "agents", Sandbox: "sandbox-0042", Template: "coder", Labels: map[string]string{"team": "payments"}, SourceIP: "127.10.0.42", Known: true},
		Target:     Target{Method: "POST", Host: "api.anthropic.com", Path: "/v1/messages", Route: "anthropic", Model: "claude-sonnet-4-5"},
		Decision:   Decision{Allow: true, Reason: "model allowed for template coder", PolicyRevision: "3f2a9c"},
		Credential: "anthropic",
		Outcome:    Outcome{Status: 200, DurationMS: 12.345678, BytesIn: 2048, BytesOut: 512, TokensIn: 120, TokensOut: 40},
		PrevHash:   strings.Repeat("ab", 32),
	}
	b.Run("encoding-json", func(b *testing.B) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		b.ReportAllocs()
		for b.Loop() {
			buf.Reset()
			_ = enc.Encode(&e)
		}
	})
	b.Run("appendEvent", func(b *testing.B) {
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			buf = appendEvent(buf[:0], &e)
		}
	})
}
