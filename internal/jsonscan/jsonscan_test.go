package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// skipPlainBytewise is skipPlain one byte at a time: the definition the word loop must match.
func skipPlainBytewise(b []byte, i int) int {
	for i < len(b) && plainString[b[i]] {
		i++
	}
	return i
}

// Every byte that ends a run of plain string bytes, at every position of the word it falls in
// and behind every start offset, is found where the bytewise loop finds it; bytes next to the
// specials in value (0x1f/0x20, '!'/'#', '['/']', 0x7f, bytes with the top bit set) are not.
func TestSkipPlainFindsEverySpecialByte(t *testing.T) {
	var specials, plains []byte
	for c := range 256 {
		if plainString[c] {
			plains = append(plains, byte(c))
		} else {
			specials = append(specials, byte(c))
		}
	}
	require.Len(t, specials, 0x20+2, "control characters, quote and backslash")
	for _, fill := range []byte{'a', 0x20, '!', '#', '[', ']', 0x7f, 0x80, 0xa2, 0xdc, 0xff} {
		for n := 0; n <= 24; n++ {
			for at := 0; at < n; at++ {
				for _, c := range specials {
					b := bytes.Repeat([]byte{fill}, n)
					b[at] = c
					for start := 0; start <= at; start++ {
						require.Equal(t, at, skipPlain(b, start), "special %#x at %d of %d, fill %#x, from %d", c, at, n, fill, start)
					}
				}
			}
			b := bytes.Repeat([]byte{fill}, n)
			require.Equal(t, n, skipPlain(b, 0), "%d plain bytes %#x", n, fill)
		}
	}
	all := append([]byte(nil), plains...)
	require.Equal(t, len(all), skipPlain(all, 0), "every plain byte, in order")
}

// A borrow out of a special byte's lane may mark the lanes above it too; the first special byte
// is still the one found, also when a second follows in the same word.
func TestSkipPlainTwoSpecialsInAWord(t *testing.T) {
	for _, pair := range [][2]byte{{0, 0x1f}, {'"', '\\'}, {0x01, '"'}, {'\\', 0x00}, {0x1f, 0x21}} {
		for a := 0; a < 8; a++ {
			for c := a + 1; c < 8; c++ {
				b := []byte("xxxxxxxxxxxxxxxx")
				b[a], b[c] = pair[0], pair[1]
				require.Equal(t, skipPlainBytewise(b, 0), skipPlain(b, 0), "%q", b)
			}
		}
	}
}

func FuzzSkipPlain(f *testing.F) {
	f.Add([]byte(`hello, "world"`), 0)
	f.Add([]byte("a\x00b\\c\"d\x1fe\x7f\xff"), 3)
	f.Add(bytes.Repeat([]byte{0x9f}, 40), 1)
	f.Fuzz(func(t *testing.T, b []byte, start int) {
		if start < 0 || start > len(b) {
			return
		}
		if got, want := skipPlain(b, start), skipPlainBytewise(b, start); got != want {
			t.Fatalf("skipPlain(%q, %d) = %d, want %d", b, start, got, want)
		}
	})
}

// BenchmarkSkipPlain scans 64 KiB of JSON string contents the way str does, word at a time
// and byte at a time, in three shapes: prose (long plain runs), source code as JSON encodes it
// (an escape every 10-20 bytes: newlines, tabs, quotes) and the proxy tests' conversation (an
// escape every 8 bytes or so).
func BenchmarkSkipPlain(b *testing.B) {
	shapes := map[string]string{
		"prose": "The quick brown fox jumps over the lazy dog, and then it rests a while. ",
		"code":  `if err != nil {\n\treturn fmt.Errorf(\"step %d: %w\", i, err)\n}\n`,
		"dense": `line 7 of a file, with \"quotes\", a \\ and a tab\t\n`,
	}
	for _, name := range []string{"prose", "code", "dense"} {
		text := bytes.Repeat([]byte(shapes[name]), (64<<10)/len(shapes[name]))
		for _, impl := range []struct {
			name string
			skip func([]byte, int) int
		}{{"words", skipPlain}, {"bytes", skipPlainBytewise}} {
			b.Run(name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					for i := impl.skip(text, 0); i < len(text); i = impl.skip(text, i+2) {
						if text[i] != '\\' {
							b.Fatalf("stopped at %q", text[i])
						}
					}
				}
			})
		}
	}
}

// A string member is read as encoding/json reads it wherever its escape, quote or control
// character falls: before, at and past the bytes str reads one at a time, and inside, at the
// edge of and past the words skipPlain reads. The raw key and value come back whole.
func TestObjectStringsAtEveryOffset(t *testing.T) {
	for _, special := range []string{`\n`, `\"`, `\\`, `\u00e9`, `\ud83d\ude00`, "\x01", "\x1f", `\x`, `\u00g0`, "\xff", "\u00e9"} {
		for n := 0; n <= 3*shortRun; n++ {
			for at := 0; at <= n; at++ {
				text := strings.Repeat("a", at) + special + strings.Repeat("b", n-at)
				body := []byte(`{"k":"` + text + `","z":1}`)
				var got [][2]string
				s := New(body)
				err := s.Object(0, func(key []byte, _ bool, val []byte) error {
					got = append(got, [2]string{string(key), string(val)})
					return nil
				})
				if !json.Valid(body) {
					require.Error(t, err, "%q", body)
					continue
				}
				require.NoError(t, err, "%q", body)
				require.Equal(t, [][2]string{{`"k"`, `"` + text + `"`}, {`"z"`, "1"}}, got, "%q", body)
			}
		}
	}
}
