package respguard

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wrap breaks s into lines of width characters, each ended by eol (the last one too), as MIME
// (76 columns, CRLF) and PEM (64 columns, LF) write base64.
func wrap(s string, width int, eol string) string {
	var b strings.Builder
	for len(s) > width {
		b.WriteString(s[:width] + eol)
		s = s[width:]
	}
	b.WriteString(s + eol)
	return b.String()
}

// unwrapped is what a sandbox reads of body with line breaks skipped, as base64 decoders
// do: the body and its JSON decoding, each without CR and LF.
func unwrapped(body string) bool {
	strip := strings.NewReplacer("\r", "", "\n", "")
	if leaked(strip.Replace(body)) {
		return true
	}
	var s string
	if jsonUnquote(body, &s) == nil && leaked(strip.Replace(s)) {
		return true
	}
	s, err := url.PathUnescape(body)
	return err == nil && leaked(strip.Replace(s))
}

// wrappedCarriers put a wrapped base64 text where an upstream could: raw in a body (a PEM
// block, a MIME part) and inside a JSON string, its breaks escaped.
var wrappedCarriers = map[string]func(text string) string{
	"PEM block": func(text string) string {
		return "-----BEGIN SECRET-----\n" + text + "-----END SECRET-----\n"
	},
	"MIME part": func(text string) string {
		return "--b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\n" + text + "--b--\r\n"
	},
	"JSON string": func(text string) string {
		return `{"attachment":` + jsonString(text) + `,"n":1}`
	},
	"JSON string, \\u escapes": func(text string) string {
		r := strings.NewReplacer("\r", `\u000d`, "\n", `\u000A`)
		return `{"attachment":"` + r.Replace(text) + `","n":1}`
	},
	"percent-encoded": func(text string) string {
		r := strings.NewReplacer("\r", `%0D`, "\n", `%0a`, "+", "%2B", "/", "%2F")
		return "data=" + r.Replace(text)
	},
}

func jsonString(s string) string {
	return `"` + strings.NewReplacer("\\", `\\`, `"`, `\"`, "\r", `\r`, "\n", `\n`).Replace(s) + `"`
}

// TestWrappedBase64IsScrubbed: base64 wrapped at MIME's 76 or PEM's 64 columns (and at widths
// an upstream picks to dodge the guard), with CRLF or LF, raw or escaped, is read as the
// sandbox's decoder reads it: whole. The key is put at every offset across the first line
// break, at each of base64's three alignments.
func TestWrappedBase64IsScrubbed(t *testing.T) {
	for _, width := range []int{76, 64, 60, 19, 4} {
		for _, eol := range []string{"\r\n", "\n"} {
			for name, carry := range wrappedCarriers {
				// The break after the first line falls at byte 3*width/4 of the payload:
				// offsets from one key before it to just after it.
				first := 3 * width / 4
				for off := max(0, first-len(secret)); off <= first; off++ {
					payload := strings.Repeat("p", off) + secret + strings.Repeat("q", 40)
					text := wrap(base64.StdEncoding.EncodeToString([]byte(payload)), width, eol)
					body := carry(text)
					require.True(t, unwrapped(body), "the test means something: %q", body)
					for _, n := range []int{1, 7, 64, len(body)} {
						for _, sse := range []bool{false, true} {
							out, hits := scrubStream(t, body, n, sse)
							if unwrapped(out) {
								t.Fatalf("width %d, eol %q, %s, key at byte %d, read in pieces of %d (pieces %v): %q", width, eol, name, off, n, sse, out)
							}
							assert.Positive(t, hits)
							assert.Len(t, out, len(body), "lengths stay true")
						}
					}
				}
			}
		}
	}
}

// TestWrappedKeyIsScrubbed: the key itself broken over lines (its characters are base64's).
func TestWrappedKeyIsScrubbed(t *testing.T) {
	for _, at := range []int{1, 8, len(secret) - 1} {
		for _, eol := range []string{"\r\n", "\n", "\r"} {
			body := secret[:at] + eol + secret[at:]
			for name, text := range map[string]string{"raw": body, "JSON": `{"k":` + jsonString(body) + `}`} {
				out, hits := scrubStream(t, text, 3, false)
				assert.Positive(t, hits, "%s %q", name, text)
				assert.NotContains(t, strings.NewReplacer("\r", "", "\n", "", `\r`, "", `\n`, "").Replace(out), secret)
			}
		}
	}
}

// TestBreaksOutsideBase64ChangeNothing: a line break after anything else is text, and text
// with line breaks but no key is passed on as it came, nothing held once it ends.
func TestBreaksOutsideBase64ChangeNothing(t *testing.T) {
	needles := Build([]string{secret}, nil)
	var s Scanner
	s.Reset(needles, false, nil)
	w := []byte("event: delta\ndata: {\"text\":\"line one\\nline two\"}\n\n")
	assert.Equal(t, len(w), s.Scan(w, 0, false))
	body := wrap(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("unrelated ", 20))), 76, "\r\n")
	out, hits := scrubStream(t, body, 5, false)
	assert.Zero(t, hits)
	assert.Equal(t, body, out)
	// A key and a break after a character outside base64 are two texts.
	body = fmt.Sprintf("%s.\n%s", secret[:10], secret[10:])
	out, hits = scrubStream(t, body, len(body), false)
	assert.Zero(t, hits)
	assert.Equal(t, body, out)
}
