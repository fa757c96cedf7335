package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLineCanonicalForm pins the documented hash: SHA-256 over the line with the hash value
// emptied, "hash" being the last member. A tool outside Go can recompute it from this.
func TestLineCanonicalForm(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 2)
	lines := readLines(t, filepath.Join(dir, ActiveFile))
	require.Len(t, lines, 2)

	var prev string
	for _, line := range lines {
		i := bytes.LastIndex(line, []byte(`,"hash":"`))
		require.Positive(t, i)
		canonical := append(append([]byte{}, line[:i]...), `,"hash":""}`...)
		sum := sha256.Sum256(canonical)

		ev, err := ParseLine(line)
		require.NoError(t, err)
		assert.Equal(t, hex.EncodeToString(sum[:]), ev.Hash)
		assert.Equal(t, prev, ev.PrevHash)
		prev = ev.Hash

		var members map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(line, &members))
		assert.NotContains(t, string(line), "\n")
		assert.True(t, strings.HasSuffix(string(line), `"hash":"`+ev.Hash+`"}`), "hash is the last member")
	}
}

func TestParseLineRejectsLinesNotInTheWritersForm(t *testing.T) {
	valid := `{"id":"a","prev_hash":"","hash":"` + strings.Repeat("0", 64) + `"}`
	tests := []struct {
		name string
		line string
		want string
	}{
		{"an empty line", "", "empty"},
		{"a JSON array", `[1,2]`, "not a JSON object"},
		{"a line without a hash", `{"id":"a"}`, "hash"},
		{"a hash in upper case", strings.Replace(valid, "0000", "ABCD", 1), "lowercase"},
		{"a short hash", `{"id":"a","hash":"abc"}`, "hash"},
		{"broken JSON before the hash", `{"id":,"hash":"` + strings.Repeat("0", 64) + `"}`, "decode"},
		{"a time that is not RFC 3339", `{"time":"yesterday","hash":"` + strings.Repeat("0", 64) + `"}`, "decode"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ParseLine([]byte(tt.line))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("a minimal line in the writer's form is accepted", func(t *testing.T) {
		ev, err := ParseLine([]byte(valid))
		require.NoError(t, err)
		assert.Equal(t, "a", ev.ID)
	})
}

// FuzzParseLine feeds arbitrary lines to the parsers Verify and Query use: they must never panic,
// and a line ParseLine accepts must yield the hash lineHash reads.
func FuzzParseLine(f *testing.F) {
	dir := f.TempDir()
	sink, err := OpenFileSink(FileConfig{Dir: dir})
	require.NoError(f, err)
	w := NewWriter(sink)
	for i := range 3 {
		ev := testEvent(i)
		require.NoError(f, w.Record(&ev))
	}
	require.NoError(f, w.Close(f.Context()))
	err = scanLines(filepath.Join(dir, ActiveFile), func(_ int, line []byte, _ error) error {
		f.Add(bytes.Clone(line))
		return nil
	})
	require.NoError(f, err)
	f.Add([]byte(`{"hash":"` + strings.Repeat("a", 64) + `"}`))
	f.Add([]byte(`{"identity":{"labels":null},"target":{"shown":-1},"hash":"` + strings.Repeat("f", 64) + `"}`))
	f.Add([]byte(`{`))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, line []byte) {
		ev, perr := ParseLine(line)
		stored, herr := storedHash(line)
		if perr != nil {
			return
		}
		if herr != nil {
			t.Fatalf("ParseLine accepted a line storedHash refuses: %v", herr)
		}
		if ev.Hash != stored {
			t.Fatalf("ParseLine hash %q, stored %q", ev.Hash, stored)
		}
		_ = plainChain.matches(line, stored)
		prev, stored2, lerr := linkedHashes(line)
		if lerr == nil && (prev != ev.PrevHash || stored2 != stored) {
			t.Fatalf("linkedHashes disagrees with ParseLine: prev %q vs %q", prev, ev.PrevHash)
		}
	})
}
