package proxy

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCaseFoldedKeysAreRefused(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"an upper-case MODEL beside the allowed model", `{"model":"claude-haiku-4-5","MODEL":"claude-opus-4","max_tokens":10}`},
		{"a mixed-case Max_Tokens beside max_tokens", `{"model":"m","max_tokens":10,"Max_Tokens":100000}`},
		{"a case variant alone", `{"Model":"claude-opus-4","max_tokens":10}`},
		{"the Kelvin sign that folds to k", `{"model":"m","max_to\u212Aens":100000}`},
		{"the long s that folds to s", `{"model":"m","\u017Ftream":true}`},
		{"a case variant written with escapes", `{"model":"m","\u004dODEL":"x"}`},
		{"a top-level key that is not valid UTF-8", "{\"model\":\"m\",\"k\xff\":1}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseModelRequest([]byte(tt.body))
			assert.Error(t, err)
		})
	}
	t.Run("nested keys that fold are not read and not refused", func(t *testing.T) {
		mr, err := ParseModelRequest([]byte(`{"model":"m","metadata":{"MODEL":"x"},"max_tokens":5}`))
		require.NoError(t, err)
		assert.Equal(t, "m", mr.Model)
	})
}

// foldingDecode is what Go's encoding/json (case-insensitive field matching, last key wins)
// reads of a body.
func foldingDecode(b []byte) (model string, maxTokens int64, stream bool, err error) {
	var v struct {
		Model     *string `json:"model"`
		MaxTokens *int64  `json:"max_tokens"`
		Stream    *bool   `json:"stream"`
	}
	if err = json.Unmarshal(b, &v); err != nil {
		return
	}
	maxTokens = -1
	if v.Model != nil {
		model = *v.Model
	}
	if v.MaxTokens != nil {
		maxTokens = *v.MaxTokens
	}
	if v.Stream != nil {
		stream = *v.Stream
	}
	return
}

// exactDecode is what a case-sensitive decoder reads.
func exactDecode(b []byte) (model string, maxTokens int64, stream bool, err error) {
	var m map[string]json.RawMessage
	if err = json.Unmarshal(b, &m); err != nil {
		return
	}
	maxTokens = -1
	if raw, ok := m["model"]; ok {
		_ = json.Unmarshal(raw, &model)
	}
	if raw, ok := m["max_tokens"]; ok && string(raw) != "null" {
		_ = json.Unmarshal(raw, &maxTokens)
	}
	if raw, ok := m["stream"]; ok {
		_ = json.Unmarshal(raw, &stream)
	}
	return
}

var foldKeys = []string{"model", "MODEL", "Model", "mOdel", `mod\u0065l`, "max_tokens", "MAX_TOKENS", "Max_Tokens",
	"max_to\u212aens", "stream", "STREAM", "\u017ftream", `\u0073tream`, "messages", "system", "metadata"}

func randomBody(r *rand.Rand) string {
	var b strings.Builder
	b.WriteString("{")
	n := 1 + r.IntN(5)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		k := foldKeys[r.IntN(len(foldKeys))]
		b.WriteString(`"` + k + `":`)
		lk := strings.ToLower(k)
		switch {
		case strings.Contains(lk, "tok") || strings.Contains(k, "\u212a"):
			b.WriteString([]string{"10", "100000", "null"}[r.IntN(3)])
		case strings.Contains(lk, "tream") || strings.Contains(k, "tream"):
			b.WriteString([]string{"true", "false"}[r.IntN(2)])
		case strings.HasPrefix(lk, "m") && !strings.HasPrefix(lk, "me"):
			b.WriteString([]string{`"claude-haiku-4-5"`, `"claude-opus-4"`}[r.IntN(2)])
		default:
			b.WriteString(`{"model":"nested","x":[1,2]}`)
		}
	}
	b.WriteString("}")
	return b.String()
}

// Whenever Sandgate reads a body without refusing it, a case-insensitive and a case-sensitive
// decoder read the same model, max_tokens and stream: policy decides on what the upstream reads.
func TestOneReadingOfTheModelBody(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range 20000 {
		body := []byte(randomBody(r))
		mr, err := ParseModelRequest(body)
		if err != nil {
			continue
		}
		accepted++
		fm, fmax, fs, ferr := foldingDecode(body)
		em, emax, es, eerr := exactDecode(body)
		require.NoError(t, ferr, "%s", body)
		require.NoError(t, eerr, "%s", body)
		require.Equal(t, []any{mr.Model, mr.MaxTokens, mr.Stream}, []any{fm, fmax, fs}, "encoding/json reads %s differently", body)
		require.Equal(t, []any{mr.Model, mr.MaxTokens, mr.Stream}, []any{em, emax, es}, "a case-sensitive decoder reads %s differently", body)
	}
	assert.Greater(t, accepted, 1000, "the generator makes enough accepted bodies to mean something")
}

func FuzzOneReadingOfTheModelBody(f *testing.F) {
	for _, s := range append([]string{`{"model":"a","MODEL":"b"}`, `{"model":"a","max_tokens":1,"stream":true}`, `{"max_to\u212aens":1}`},
		multiLineModelBodies...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		mr, err := ParseModelRequest(body)
		if err != nil {
			return
		}
		fm, fmax, fs, ferr := foldingDecode(body)
		if ferr != nil {
			return // a type encoding/json refuses where Sandgate reads null or skips: no upstream reads it
		}
		if mr.Model != fm || mr.Stream != fs || (mr.MaxTokens != fmax && !(mr.MaxTokens >= fmax)) {
			t.Fatalf("encoding/json reads %q as %q/%d/%v, Sandgate as %q/%d/%v", body, fm, fmax, fs, mr.Model, mr.MaxTokens, mr.Stream)
		}
	})
}
