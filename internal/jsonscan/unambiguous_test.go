package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnambiguous(t *testing.T) {
	refused := []struct {
		name string
		body string
	}{
		{"a key twice at the top level", `{"a":1,"a":2}`},
		{"a key twice in a nested object", `{"x":{"path":"/ok","path":"/etc/passwd"}}`},
		{"a key twice in an object inside an array", `{"x":[1,{"k":true,"b":0,"k":false}]}`},
		{"a key twice, once escaped", `{"x":{"ab":1,"a\u0062":2}}`},
		{"keys that differ only in ASCII case", `{"message":"hi","Message":"forbidden"}`},
		{"the Kelvin sign for k", `{"k":1,"\u212a":2}`},
		{"the long s for S", `{"S":1,"ſ":2}`},
		{"a repeated key after more keys than are compared one by one", manyKeys(40, "k7")},
		{"a key that is not UTF-8", "{\"a\xff\":1}"},
		{"a value that is not UTF-8", "{\"a\":\"\xc3\x28\"}"},
		{"a lone high surrogate in a key", `{"\ud800":1}`},
		{"a lone low surrogate in a value", `{"a":"x\udc00y"}`},
		{"a high surrogate followed by another high one", `{"a":"\ud800\ud800"}`},
		{"a high surrogate at the end of a string", `["\udbff"]`},
	}
	for _, tt := range refused {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			err := Unambiguous([]byte(tt.body))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrAmbiguous)
		})
	}
	accepted := []struct {
		name string
		body string
	}{
		{"one key per object", `{"a":1,"b":{"a":2,"c":[{"a":3},{"a":4}]}}`},
		{"the same key in sibling objects", `[{"k":1},{"k":2}]`},
		{"the same key at different depths", `{"k":{"k":{"k":1}}}`},
		{"keys that differ in more than case", `{"id":1,"ids":2,"İd":3}`},
		{"many distinct keys", manyKeys(300, "")},
		{"a surrogate pair", `{"a":"\ud83d\ude00","\ud83d\ude00":1}`},
		{"an escaped backslash before u", `{"a":"\\ud800"}`},
		{"an empty object and array", `{"a":{},"b":[],"c":""}`},
		{"a scalar", `"x"`},
	}
	for _, tt := range accepted {
		t.Run(tt.name+" is accepted", func(t *testing.T) {
			assert.NoError(t, Unambiguous([]byte(tt.body)))
		})
	}
	t.Run("syntax errors are not ambiguity", func(t *testing.T) {
		for _, b := range []string{`{"a":1,}`, `{"a"}`, `[1,2`, `{"a":1} x`, ``} {
			err := Unambiguous([]byte(b))
			require.Error(t, err, b)
			assert.NotErrorIs(t, err, ErrAmbiguous, b)
		}
	})
}

// manyKeys is an object of n keys k0…k(n-1), then extra (when set) again.
func manyKeys(n int, extra string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	if extra != "" {
		fmt.Fprintf(&b, `%q:0,`, extra)
	}
	b.WriteString(`"end":0}`)
	return b.String()
}

// member is one member of a decoded object, in the order written.
type member struct {
	key string
	val any
}

// decodeAll decodes one JSON value keeping every member of every object, repeats included:
// what each reader picks from is there.
func decodeAll(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		var obj []member
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeAll(d)
			if err != nil {
				return nil, err
			}
			obj = append(obj, member{k.(string), v})
		}
		_, err := d.Token()
		return obj, err
	case json.Delim('['):
		arr := []any{}
		for d.More() {
			v, err := decodeAll(d)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err := d.Token()
		return arr, err
	}
	return tok, nil
}

// pick is what a reader that keeps the first (or the last) of repeated keys reads.
func pick(v any, last bool) any {
	switch v := v.(type) {
	case []member:
		out := map[string]any{}
		for _, m := range v {
			if _, seen := out[m.key]; !seen || last {
				out[m.key] = pick(m.val, last)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = pick(e, last)
		}
		return out
	}
	return v
}

// foldCollision reports two keys of one object that strings.EqualFold takes for one.
func foldCollision(v any) bool {
	switch v := v.(type) {
	case []member:
		for i := range v {
			for j := i + 1; j < len(v); j++ {
				if strings.EqualFold(v[i].key, v[j].key) {
					return true
				}
			}
			if foldCollision(v[i].val) {
				return true
			}
		}
	case []any:
		for _, e := range v {
			if foldCollision(e) {
				return true
			}
		}
	}
	return false
}

var jsonString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// lonelySurrogateRef reports a string of b (valid UTF-8 JSON) in which encoding/json, which
// reads half a surrogate pair as U+FFFD, finds more U+FFFD than b writes.
func lonelySurrogateRef(b []byte) bool {
	for _, s := range jsonString.FindAll(b, -1) {
		var dec string
		if err := json.Unmarshal(s, &dec); err != nil {
			panic(err)
		}
		written := strings.Count(string(s), "\uFFFD")
		for i := 1; i < len(s)-1; i++ {
			if s[i] == '\\' {
				if s[i+1] == 'u' && strings.EqualFold(string(s[i+2:i+6]), "fffd") {
					written++
				}
				i++
			}
		}
		if strings.Count(dec, "\uFFFD") > written {
			return true
		}
	}
	return false
}

// checkOneReading is the differential property: Unambiguous refuses exactly the valid JSON a
// reference says readers read differently, and whatever it accepts, a reader keeping the first
// of repeated keys and one keeping the last (encoding/json) read alike.
func checkOneReading(t *testing.T, b []byte) {
	err := Unambiguous(b)
	if !json.Valid(b) {
		if err == nil {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		return
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	all, derr := decodeAll(d)
	if derr != nil {
		t.Fatalf("decode %q: %v", b, derr)
	}
	want := !bytes.Equal(bytes.ToValidUTF8(b, nil), b) || lonelySurrogateRef(b) || foldCollision(all)
	if got := err != nil; got != want {
		t.Fatalf("Unambiguous(%q) = %v, the reference says ambiguous: %v", b, err, want)
	}
	if err != nil {
		if !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("Unambiguous(%q) = %v, not ErrAmbiguous", b, err)
		}
		return
	}
	var last any
	d = json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&last); err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	first := pick(all, false)
	if fmt.Sprint(first) != fmt.Sprint(last) || fmt.Sprint(pick(all, true)) != fmt.Sprint(last) {
		t.Fatalf("readers differ on %q: first %v, encoding/json %v", b, first, last)
	}
}

var oneReadingKeys = []string{"a", "A", "path", "PATH", "Path", `p\u0061th`, "k", "K", "\u212a", "s", "ſ", "S",
	`\ud800`, `\udc00`, `\ud83d\ude00`, "\xff", "é", "É", "id"}

var oneReadingValues = []string{`1`, `"x"`, `"\ud800"`, `"\\ud800"`, `"\ud83d\ude00"`, `null`, `true`, `[]`, `{}`, "\"\xfe\""}

// randomValue is a JSON value of keys and values likely to collide, depth levels deep at most.
func randomValue(r *rand.Rand, b *strings.Builder, depth int) {
	switch n := r.IntN(4); {
	case depth > 0 && n == 0:
		b.WriteString("[")
		for i := range r.IntN(3) {
			if i > 0 {
				b.WriteString(",")
			}
			randomValue(r, b, depth-1)
		}
		b.WriteString("]")
	case depth > 0 && n == 1:
		b.WriteString("{")
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(`"` + oneReadingKeys[r.IntN(len(oneReadingKeys))] + `":`)
			randomValue(r, b, depth-1)
		}
		b.WriteString("}")
	default:
		b.WriteString(oneReadingValues[r.IntN(len(oneReadingValues))])
	}
}

func TestOneReadingDifferential(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	accepted, refused := 0, 0
	for range 30000 {
		var args strings.Builder
		randomValue(r, &args, 3)
		body := []byte(`{"args":` + args.String() + "}")
		checkOneReading(t, body)
		if Unambiguous(body) == nil {
			accepted++
		} else {
			refused++
		}
	}
	assert.Greater(t, accepted, 3000, "the generator makes enough unambiguous bodies to mean something")
	assert.Greater(t, refused, 3000, "and enough ambiguous ones")
}

func FuzzOneReading(f *testing.F) {
	for _, s := range []string{`{"a":1,"A":2}`, `{"x":[{"k":1},{"\u212a":2}]}`, `{"a":"\ud800"}`, `{"a":"\ud83d\ude00"}`,
		manyKeys(20, "K3"), "{\"\xff\":1}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(checkOneReading)
}
