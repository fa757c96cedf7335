package respguard

import (
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/sse/ssetest"
)

// eventReader returns one event per Read.
type eventReader struct{ events []string }

func (e *eventReader) Read(p []byte) (int, error) {
	if len(e.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.events[0])
	if e.events[0] = e.events[0][n:]; e.events[0] == "" {
		e.events = e.events[1:]
	}
	return n, nil
}

// BenchmarkReader is the guard's cost for one answer: the bench's short streamed answer read
// event by event, a long one of many deltas read in 32 KiB reads, and a non-streamed answer
// (JSON, read in pieces too since issue 59) in one read, long and as small as the bench's
// model-API stand-in gives. "static" reads with one set of needles, one credential's, as every
// answer does without minted credentials; "runs" with the set of the answer's own run, out of
// 200 (Source.For: the static value and the run's token, in Ory Hydra's form), as the bench's
// route does with a minted credential (issue 57): the sets take turns, so that their tables
// are as cold as in a Sandgate serving 200 runs.
func BenchmarkReader(b *testing.B) {
	toks := hydraTokens(200)
	b.Run("static", func(b *testing.B) { benchmarkReader(b, []*Needles{Build([]string{benchStatic}, nil)}) })
	b.Run("runs", func(b *testing.B) { benchmarkReader(b, forSets(toks)) })
	// "cold": as many runs' sets as leave each one out of the caches when its answer comes
	// (4,096 sets of about 9 KiB: past this machine's 32 MiB L3), as a Sandgate with thousands
	// of sandboxes reads its run's set.
	b.Run("cold", func(b *testing.B) { benchmarkReader(b, forSets(hydraTokens(4096))) })
	// "cold-static": as many sets of the static key alone, each as cold: what "cold" costs
	// beyond it is what a run's token adds to an answer's scan (the figure of issue 57).
	b.Run("cold-static", func(b *testing.B) {
		sets := make([]*Needles, 4096)
		for i := range sets {
			sets[i] = Build([]string{benchStatic}, nil)
		}
		benchmarkReader(b, sets)
	})
	// "all": one set of every run's token (Source.Current, the MCP half's).
	b.Run("all", func(b *testing.B) { benchmarkReader(b, []*Needles{Build(append([]string{benchStatic}, toks...), nil)}) })
}

// benchStatic is the bench's static model-API key (bench.benchAPIKey).
const benchStatic = "sk-bench-not-a-real-key-0123456789"

// hydraTokens are n random tokens in Ory Hydra's form, as the bench's token endpoint mints them.
func hydraTokens(n int) []string {
	out := make([]string, n)
	for i := range out {
		tok := make([]byte, 64)
		_, _ = rand.Read(tok)
		enc := base64.RawURLEncoding
		out[i] = "ory_at_" + enc.EncodeToString(tok[:32]) + "." + enc.EncodeToString(tok[32:])
	}
	return out
}

// forSets are the sets Source.For makes for runs holding toks: the static key and one token.
func forSets(toks []string) []*Needles {
	sets := make([]*Needles, len(toks))
	for i, tok := range toks {
		sets[i] = Build([]string{benchStatic, tok}, nil)
	}
	return sets
}

func benchmarkReader(b *testing.B, sets []*Needles) {
	long := strings.Join(ssetest.LongModelAnswer("claude-bench", 2000), "")
	json := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"` +
		strings.Repeat(`Here is the change you asked for.\n\n`, 60) + `"}],"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":51200,"output_tokens":503}}`
	small := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"Hello from the bench"}],` +
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":34}}`
	for name, events := range map[string][]string{"short": ssetest.ModelAnswer("claude-bench"), "long": {long}, "json": {json}, "small": {small}} {
		size := 0
		for _, e := range events {
			size += len(e)
		}
		pieces := InPieces(http.Header{"Content-Type": {map[bool]string{true: "application/json", false: "text/event-stream"}[name == "json" || name == "small"]}})
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			buf := make([]byte, 32<<10)
			i := 0
			for b.Loop() {
				i++
				r := NewReader(&eventReader{events: append([]string(nil), events...)}, sets[i%len(sets)], pieces, nil)
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}

// BenchmarkHeld is the check the guard makes at the end of every string value of a JSON
// message or event (pieces.settlePlain): whether its tail may begin a credential. The values
// are a model answer's words, each ending differently, read with the 200 runs' sets of
// BenchmarkReader in turn (cold tables, and no ending learned by the branch predictor).
func BenchmarkHeld(b *testing.B) {
	sets := forSets(hydraTokens(200))
	var words [][]byte
	for _, w := range strings.Fields(strings.Repeat("Here is the change you asked for: the handler now checks the token's expiry before it refreshes, "+
		"and the test covers a refresh racing a revoke. message_start content_block_delta text_delta end_turn claude-bench msg_1 assistant ", 3)) {
		words = append(words, []byte(w))
	}
	i := 0
	for b.Loop() {
		i++
		sets[i%len(sets)].held(words[i%len(words)])
	}
}

// BenchmarkBuild is what a change of the credentials costs: the set of one run (a static key
// and the run's token, Source.For's) and the set of 1,000 runs' tokens (Source.Current's, the
// MCP half's), built once per mint, refresh or end.
func BenchmarkBuild(b *testing.B) {
	vals := append([]string{benchStatic}, hydraTokens(1000)...)
	for name, vs := range map[string][]string{"run": vals[:2], "runs1000": vals} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Build(vs, nil)
			}
		})
	}
}

// BenchmarkPrefixFlood is an upstream's answer made to cost the guard: 64 KiB of what every
// run's token forms begin with (hex of "ory_", "6f72795f", and a base64 form's first 8
// characters), read with the set of 1,000 runs' tokens, as a body and as one JSON string.
func BenchmarkPrefixFlood(b *testing.B) {
	vals := append([]string{benchStatic}, hydraTokens(1000)...)
	set := Build(vals, nil)
	flood := strings.Repeat("6f72795f"+Base64Forms(vals[1])[0][:8], 4<<10)
	for name, body := range map[string]string{"body": flood, "json": `{"text":"` + flood + `"}`} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			buf := make([]byte, 32<<10)
			for b.Loop() {
				r := NewReader(strings.NewReader(body), set, name == "json", nil)
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
