package respguard

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const secret = "sk-ant-REAL-0123456789abcdef"

// jsonU is s with every byte written as a \u escape, case mixed.
func jsonU(s string) string {
	var b strings.Builder
	for i, c := range []byte(s) {
		if i%2 == 0 {
			fmt.Fprintf(&b, `\u%04x`, c)
		} else {
			fmt.Fprintf(&b, `\u%04X`, c)
		}
	}
	return b.String()
}

// percent is s with every byte percent-encoded.
func percent(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// forms are the ways an upstream can spell the secret that a sandbox can read back.
func forms() map[string]string {
	return map[string]string{
		"raw":                      secret,
		"base64 standard":          base64.StdEncoding.EncodeToString([]byte(secret)),
		"base64 URL, shifted by 1": base64.URLEncoding.EncodeToString([]byte("x" + secret)),
		"base64 shifted by 2":      base64.StdEncoding.EncodeToString([]byte("xy" + secret)),
		"hex lower":                hex.EncodeToString([]byte(secret)),
		"hex upper":                strings.ToUpper(hex.EncodeToString([]byte(secret))),
		"JSON \\u escapes":         jsonU(secret),
		"one JSON \\u escape":      `sk-ant-REAL-0123456789\u0061bcdef`,
		"percent-encoding":         percent(secret),
		"query escape":             url.QueryEscape(secret),
		"partly percent-encoded":   "sk-ant-REAL%2D0123456789abcdef",
		"escaped slash in base64":  strings.ReplaceAll(base64.StdEncoding.EncodeToString([]byte("??>"+secret)), "/", `\/`),
	}
}

// readable is what a sandbox can make of body: the body, and its JSON, percent and base64
// decodings.
func leaked(body string) bool {
	if strings.Contains(body, secret) || strings.Contains(strings.ToLower(body), hex.EncodeToString([]byte(secret))) {
		return true
	}
	var s string
	if err := jsonUnquote(body, &s); err == nil && strings.Contains(s, secret) {
		return true
	}
	if s, err := url.PathUnescape(body); err == nil && strings.Contains(s, secret) {
		return true
	}
	// Every run of base64 characters, JSON's \/ read as /, decoded at each of its alignments.
	text := strings.ReplaceAll(body, `\/`, "/")
	runs := strings.FieldsFunc(text, func(r rune) bool {
		return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("+/-_", r))
	})
	for _, run := range runs {
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for off := 0; off < 4 && off < len(run); off++ {
				for cut := 0; cut < 3 && cut < len(run)-off; cut++ {
					b, err := enc.DecodeString(run[off : len(run)-cut])
					if err == nil && bytes.Contains(b, []byte(secret)) {
						return true
					}
				}
			}
		}
	}
	return false
}

func jsonUnquote(s string, out *string) error {
	b := []byte(`"` + strings.ReplaceAll(s, `"`, `\"`) + `"`)
	return jsonUnmarshal(b, out)
}

// scrubStream reads body through a Reader in pieces of n bytes.
func scrubStream(t *testing.T, body string, n int, sse bool) (string, int) {
	t.Helper()
	needles := Build([]string{secret}, nil)
	hits := 0
	r := NewReader(iotest.HalfReader(&chunked{s: body, n: n}), needles, sse, func() { hits++ })
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return string(out), hits
}

// chunked returns s n bytes per read.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[k:]
	return k, nil
}

func TestEveryFormIsScrubbed(t *testing.T) {
	for name, form := range forms() {
		t.Run(name, func(t *testing.T) {
			require.True(t, leaked(form), "the form must betray the secret before scrubbing")
			body := `{"text":"` + form + `","n":1}`
			for _, n := range []int{1, 3, 7, 64, len(body)} {
				out, hits := scrubStream(t, body, n, false)
				assert.False(t, leaked(out), "pieces of %d: %s", n, out)
				assert.Len(t, out, len(body), "lengths stay true")
				assert.Positive(t, hits)
				assert.Contains(t, out, `"n":1}`)
			}
		})
	}
}

func TestNothingHeldWithoutCause(t *testing.T) {
	needles := Build([]string{secret}, nil)
	var s Scanner
	s.Reset(needles, true, nil)
	w := []byte("event: delta\ndata: {\"text\":\"hello, world\"}\n\n")
	assert.Equal(t, len(w), s.Scan(w, 0, false), "a complete event goes on at once")
	w = []byte(`data: {"text":"sk-an`)
	assert.Less(t, s.Scan(w, 0, false), len(w), "a tail that begins the secret waits")
}

func TestSecretInPiecesAcrossEvents(t *testing.T) {
	var stream strings.Builder
	for i := 0; i < len(secret); i += 3 {
		fmt.Fprintf(&stream, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", secret[i:min(i+3, len(secret))])
	}
	body := stream.String()
	for _, n := range []int{1, 5, 40, len(body)} {
		out, hits := scrubStream(t, body, n, true)
		assert.Positive(t, hits, "pieces of %d", n)
		assert.NotContains(t, joinedText(out), secret[3:], "a sandbox joining the deltas learns at most the first bytes")
		assert.Len(t, out, len(body))
	}
	out, _ := scrubStream(t, body, len(body), false)
	assert.Contains(t, joinedText(out), secret, "read as one body, pieces are not looked for (the test means something)")
}

// TestPiecesStartFreshOnEveryStream: the lexer state of a finished stream is reused (pool), and
// nothing of it carries over. A stream that ends on the first half of the secret leaves that
// half in its "text" view; the next stream, beginning with the second half, is another
// response and passes unchanged; a stream after it that splits the secret is still caught.
func TestPiecesStartFreshOnEveryStream(t *testing.T) {
	event := func(text string) string {
		return fmt.Sprintf("data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":%q}}\n\n", text)
	}
	half := len(secret) / 2
	split := event(secret[:half]) + event(secret[half:])
	for range 20 { // the pool may drop an entry; each round ends one stream and starts others
		first, _ := scrubStream(t, event("lead ")+event(secret[:half]), 7, true)
		require.Equal(t, secret[:pieceHold-1], joinedText(first)[len("lead "):][:pieceHold-1])

		second := event(secret[half:])
		out, hits := scrubStream(t, second, 7, true)
		assert.Zero(t, hits, "a new stream does not continue the last one's pieces")
		assert.Equal(t, second, out)

		out, hits = scrubStream(t, split, 7, true)
		assert.Positive(t, hits)
		assert.NotContains(t, joinedText(out), secret[pieceHold:])
	}
}

// joinedText joins the "text" values of an SSE stream of JSON events.
func joinedText(stream string) string {
	var b strings.Builder
	for _, l := range strings.Split(stream, "\n") {
		d, ok := strings.CutPrefix(l, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if jsonUnmarshal([]byte(d), &ev) == nil {
			b.WriteString(ev.Delta.Text)
		}
	}
	return b.String()
}

func TestWriter(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out, Build([]string{secret}, nil), false, nil)
	body := `{"result":"` + jsonU(secret) + `"}`
	for i := 0; i < len(body); i += 5 {
		_, err := w.Write([]byte(body[i:min(i+5, len(body))]))
		require.NoError(t, err)
	}
	require.NoError(t, w.End())
	assert.Len(t, out.String(), len(body))
	assert.False(t, leaked(out.String()), out.String())
	assert.Equal(t, 1, w.Hits())
}

func TestScrubHeaderAndString(t *testing.T) {
	n := Build([]string{secret}, []string{"Bearer " + secret})
	h := map[string][]string{"X-Echo": {"key=" + percent(secret)}, "X-Ok": {"fine"}}
	assert.True(t, n.ScrubHeader(h))
	assert.Equal(t, map[string][]string{"X-Ok": {"fine"}}, h)
	s, hit := n.ScrubString("upstream said: Authorization: Bearer " + secret)
	assert.True(t, hit)
	assert.NotContains(t, s, secret)
	s, hit = n.ScrubString("upstream said: no such tool, nothing else")
	assert.False(t, hit, "a text without a credential is no hit")
	assert.Equal(t, "upstream said: no such tool, nothing else", s)
}

// FuzzReader: read in any pieces, as a body or in pieces too (an event stream or a JSON
// message, whose lexer state each input takes from the pool the last one gave it back to), a
// body keeps its length and no form the scanner reads (raw, decoded, or wrapped base64 whole)
// survives it.
func FuzzReader(f *testing.F) {
	for _, form := range forms() {
		f.Add([]byte(`{"a":"`+form+`"}`), uint8(5))
		f.Add([]byte(`data: {"text":"`+form[:5]+`"}`+"\n\n"+`data: {"text":"`+form[5:]+`"}`), uint8(0x85))
	}
	f.Add([]byte(`\\u0073`+jsonU(secret)+`%`), uint8(1))
	// Wrapped base64 (issue 59): MIME's 76 columns and CRLF, PEM's 64 and LF, raw, inside a JSON
	// string and across the events of a stream; and a key broken over lines.
	b64 := base64.StdEncoding.EncodeToString([]byte("0123456789abcdefghijklmnopqrstuvwxyz01234" + secret + "tail"))
	for _, w := range []struct {
		width int
		eol   string
	}{{76, "\r\n"}, {64, "\n"}, {5, "\n"}} {
		var lines []string
		for s := b64; s != ""; s = s[min(w.width, len(s)):] {
			lines = append(lines, s[:min(w.width, len(s))])
		}
		text := strings.Join(lines, w.eol)
		f.Add([]byte("-----BEGIN X-----"+w.eol+text+w.eol+"-----END X-----"), uint8(7))
		f.Add([]byte(`{"pem":`+jsonString(text)+`}`), uint8(13))
		f.Add([]byte(`data: {"text":`+jsonString(lines[0]+w.eol)+`}`+"\n\n"+`data: {"text":`+jsonString(strings.Join(lines[1:], w.eol))+`}`+"\n\n"), uint8(0x83))
	}
	f.Add([]byte(secret[:9]+"\r\n"+secret[9:]), uint8(2))
	// One message's strings (issue 59): text content parts, an array of strings.
	f.Add([]byte(`{"content":[{"type":"text","text":"`+secret[:6]+`"},{"type":"text","text":"`+secret[6:]+`"}]}`), uint8(0x84))
	f.Add([]byte(`{"lines":["`+secret[:1]+`","`+secret[1:20]+`","`+secret[20:]+`"]}`), uint8(0x81))
	needles := Build([]string{secret}, nil)
	f.Fuzz(func(t *testing.T, body []byte, piece uint8) {
		r := NewReader(&chunked{s: string(body), n: int(piece%32) + 1}, needles, piece >= 0x80, nil)
		out, err := io.ReadAll(r)
		require.NoError(t, err)
		require.Len(t, out, len(body))
		if _, hit := needles.ScrubString(string(out)); hit {
			t.Fatalf("%q read in pieces of %d (event stream: %t) left a credential: %q", body, piece%32+1, piece >= 0x80, out)
		}
	})
}

// hydraToken is a token in Ory Hydra's form, one run's, for the tests of held.
const hydraToken = "ory_at_Tq1cM3zYw9dH0f2pVbX8kRjLnE5uGsA7oI4eCyQ6hWtZx0aB9cD.8eF7gH6iJ5kL4mN3oP2qR1sT0uV9wX8yZ7aQw3Er5Ty7Ui9OpAs1Df"

// heldByDefinition is Needles.held as its comment defines it, every suffix tried.
func heldByDefinition(n *Needles, w []byte) int {
	for i := max(0, len(w)-n.maxBody+1); i < len(w); i++ {
		for _, nd := range n.body {
			if len(nd) > len(w)-i && bytes.HasPrefix(nd, w[i:]) {
				return len(w) - i
			}
		}
	}
	return 0
}

// FuzzHeld: held, which tries only the lengths its tables allow, finds what trying every
// suffix finds, for one credential and for one beside a run's token (issue 57's sets: the
// tables hash byte pairs, and a collision may only add lengths to try, never lose one).
func FuzzHeld(f *testing.F) {
	sets := []*Needles{Build([]string{secret}, nil), Build([]string{secret, hydraToken}, []string{"Bearer " + hydraToken})}
	for _, n := range sets {
		for _, nd := range n.body {
			for _, cut := range []int{1, 2, 3, len(nd) / 2, len(nd) - 1} {
				f.Add([]byte("text "+string(nd[:cut])), uint8(0))
			}
		}
	}
	f.Add([]byte("claude-bench"), uint8(1))
	f.Add([]byte(""), uint8(1))
	f.Fuzz(func(t *testing.T, w []byte, set uint8) {
		n := sets[int(set)%len(sets)]
		if got, want := n.held(w), heldByDefinition(n, w); got != want {
			t.Fatalf("held(%q) = %d, by definition %d", w, got, want)
		}
	})
}

// TestHeldAsDefined checks held against its definition on every prefix of every needle behind
// ordinary text, and on text alone.
func TestHeldAsDefined(t *testing.T) {
	n := Build([]string{secret, hydraToken}, []string{"Bearer " + hydraToken})
	texts := []string{"", "Hello from the bench", "claude-bench", strings.Repeat("the quick brown fox ", 12)}
	held := 0
	for _, text := range texts {
		for _, nd := range n.body {
			for cut := 0; cut <= len(nd); cut++ {
				w := []byte(text + string(nd[:cut]))
				want := heldByDefinition(n, w)
				require.Equal(t, want, n.held(w), "%q", w)
				if want > 0 {
					held++
				}
			}
		}
	}
	assert.Greater(t, held, 1000, "the cases hold back something")
}
