package proxy

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseModelRequest(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    ModelRequest
		wantErr string
	}{
		{"Anthropic message gives model, max_tokens and stream",
			`{"model":"claude-haiku-4-5","max_tokens":1024,"messages":[{"role":"user","content":"hi"}],"stream":true}`,
			ModelRequest{Model: "claude-haiku-4-5", MaxTokens: 1024, Stream: true}, ""},
		{"missing max_tokens is -1", `{"model":"gpt-5"}`, ModelRequest{Model: "gpt-5", MaxTokens: -1}, ""},
		{"OpenAI max_completion_tokens counts", `{"model":"gpt-5","max_completion_tokens":50}`, ModelRequest{Model: "gpt-5", MaxTokens: 50}, ""},
		{"Responses max_output_tokens counts", `{"model":"gpt-5","max_output_tokens":70,"stream":false}`, ModelRequest{Model: "gpt-5", MaxTokens: 70}, ""},
		{"the largest of several caps counts", `{"max_tokens":10,"max_completion_tokens":900}`, ModelRequest{MaxTokens: 900}, ""},
		{"nested model keys are ignored", `{"metadata":{"model":"x"},"model":"y"}`, ModelRequest{Model: "y", MaxTokens: -1}, ""},
		{"null stream and cap are absent", `{"stream":null,"max_tokens":null}`, ModelRequest{MaxTokens: -1}, ""},
		{"duplicate model key is refused", `{"model":"claude-haiku-4-5","model":"claude-opus-4-1"}`, ModelRequest{}, "appears twice"},
		{"model that is not a string is refused", `{"model":["a"]}`, ModelRequest{}, "not a string"},
		{"negative max_tokens is refused", `{"max_tokens":-5}`, ModelRequest{}, "non-negative"},
		{"fractional max_tokens is refused", `{"max_tokens":1.5}`, ModelRequest{}, "non-negative"},
		{"string stream is refused", `{"stream":"yes"}`, ModelRequest{}, "not a boolean"},
		{"array body is refused", `[{"model":"x"}]`, ModelRequest{}, "not a JSON object"},
		{"trailing data is refused", `{"model":"a"} {"model":"b"}`, ModelRequest{}, "data after"},
		{"truncated body is refused", `{"model":"a"`, ModelRequest{}, "model request body"},
		{"whitespace around every token is read (Python's json.dumps writes \": \")",
			"{\"model\": \"gpt-5\", \"max_tokens\" :\t7 ,\n \"stream\":\r\ntrue , \"messages\": [ {\"a\": 1} ] }",
			ModelRequest{Model: "gpt-5", MaxTokens: 7, Stream: true}, ""},
		{"a pretty-printed body is read", "{\n  \"model\": \"m\",\n  \"max_completion_tokens\": 3\n}\n",
			ModelRequest{Model: "m", MaxTokens: 3}, ""},
		{"null model with a space is absent", `{"model": null}`, ModelRequest{MaxTokens: -1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseModelRequest([]byte(tt.body))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseModelRequest holds the scanner to two references: encoding/json's Decoder, the
// parser it replaced (same verdict, same fields), and json.Valid (a body it accepts is valid
// JSON). A body they disagree on is one an upstream might read differently from the policy.
// multiLineModelBodies are model requests whose fields run over several lines, or carry
// wrapped encodings (issue 59): line breaks between every token, inside values as escapes, in
// a key, and base64 wrapped as MIME and PEM wrap it in a message's content.
var multiLineModelBodies = []string{
	"{\n\"model\"\n:\n\"claude-haiku-4-5\"\n,\n\"max_tokens\"\r\n:\r\n5\r\n,\"stream\"\n:\ntrue\n}",
	"{\r\n  \"model\": \"claude-haiku-4-5\",\r\n  \"model\": \"claude-opus-4-1\"\r\n}",
	`{"model":"claude-\nhaiku-4-5","max_tokens":1}`,
	`{"mod\u000Ael":"x","model":"claude-haiku-4-5"}`,
	`{"model\r\n":"x","model":"y"}`,
	`{"model":"claude-haiku-4-5","messages":[{"role":"user","content":"-----BEGIN KEY-----\nTUlJQklqQU5CZ2txaGtpRzl3MEJBUUVGQUFPQ0FR\nOEFNSUlCQ2dLQ0FRRUF0ZXN0\n-----END KEY-----\n"}]}`,
	`{"model":"claude-haiku-4-5","max_tokens":2,"messages":[{"role":"user","content":"TUlJQklqQU5CZ2txaGtpRzl3MEJBUUVGQUFPQ0FROEFNSUlCQ2dLQ0FRRUF0ZXN0dGVzdHRlc3R0ZXN0dGVzdHRlc3R0\r\nZXN0dGVzdA=="}]}`,
	"{\"model\":\"claude-haiku-4-5\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part one\"},\n{\"type\":\"text\",\"text\":\"part two\"}]}]}",
}

func FuzzParseModelRequest(f *testing.F) {
	for _, s := range []string{`{"model":"a","max_tokens":1,"stream":true}`, `{"model":1}`, `{}`, `[`,
		`{"a":{"b":[1,2]}}`, `{"mod\u0065l":"x","model":"y"}`, `{"a":[{"b":"\ud83d\ude00"},-0.5e+3,true,null]}`,
		` {"max_tokens":9223372036854775808} `, `{"a":"\x"}`, `{"a":01}`, `{"a":[1,]}`, `{"model":"a\u00"}`,
		`{"model": "m", "max_tokens" : 5, "stream" : false, "x": [ 1 , { "y" : null } ] }`, "{\n\t\"model\":\r\n\"m\"\n}",
		`{"MODEL":"x"}`, `{"max_to\u212aens":1}`, "{\"\x83\":true}", "{\"a\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	for _, s := range multiLineModelBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseModelRequest(b)
		want, refErr := parseModelRequestDecoder(b)
		// The Decoder hands keys over with invalid UTF-8 replaced, so it cannot refuse a key
		// that is not valid UTF-8 as the scanner does; such a refusal needs a body that is not.
		nonUTF8Key := err != nil && refErr == nil && strings.Contains(err.Error(), "not valid UTF-8") && !utf8.Valid(b)
		if (err == nil) != (refErr == nil) && !nonUTF8Key {
			t.Fatalf("%q: scanner error %v, decoder error %v", b, err, refErr)
		}
		if err != nil {
			return
		}
		if got != want {
			t.Fatalf("%q: scanner %+v, decoder %+v", b, got, want)
		}
		if !json.Valid(b) {
			t.Fatalf("%q accepted but not valid JSON", b)
		}
		if got.MaxTokens < -1 {
			t.Fatalf("MaxTokens %d", got.MaxTokens)
		}
	})
}

func TestParseModelRequestDepth(t *testing.T) {
	nest := func(n int) []byte {
		return []byte(`{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `,"model":"m"}`)
	}
	// The top-level object is one level: encoding/json allows 10000 in all.
	mr, err := ParseModelRequest(nest(9999))
	require.NoError(t, err)
	assert.Equal(t, "m", mr.Model)
	assert.True(t, json.Valid(nest(9999)))
	_, err = ParseModelRequest(nest(10000))
	require.ErrorContains(t, err, "exceeded max depth")
	assert.False(t, json.Valid(nest(10000)))
}

// conversationBody is a model request the size agents send: the whole conversation so far.
func conversationBody(size int) []byte {
	var msgs []map[string]any
	for i, n := 0, 0; n < size; i++ {
		text := strings.Repeat(fmt.Sprintf("line %d of a file, with \"quotes\", a \\ and a tab\t\n", i), 20)
		msgs = append(msgs, map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": text}}})
		n += len(text) + 64
	}
	b, _ := json.Marshal(map[string]any{"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
		"system": "You are a coding agent.", "messages": msgs, "temperature": 0.7})
	return b
}

func TestParseModelRequestConversation(t *testing.T) {
	body := conversationBody(64 << 10)
	got, err := ParseModelRequest(body)
	require.NoError(t, err)
	assert.Equal(t, ModelRequest{Model: "claude-sonnet-4-5", MaxTokens: 1024, Stream: true}, got)
	want, err := parseModelRequestDecoder(body)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// screenshotBody is a model request with a screenshot in it, as agents that drive a browser
// send one: 512 KiB of base64 in an image block, and a short question.
func screenshotBody() []byte {
	png := make([]byte, 384<<10)
	for i := range png {
		png[i] = byte(i * 7919 >> 3)
	}
	img := map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png",
		"data": base64.StdEncoding.EncodeToString(png)}}
	msgs := []any{map[string]any{"role": "user", "content": []any{img, map[string]any{"type": "text", "text": "What does the page show?"}}}}
	b, _ := json.Marshal(map[string]any{"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": msgs})
	return b
}

// BenchmarkParseModelRequest compares the scanner with the encoding/json Decoder it replaced,
// on a small request, on conversations of 16 KiB and 256 KiB and on a 512 KiB screenshot.
func BenchmarkParseModelRequest(b *testing.B) {
	bodies := map[string][]byte{"screenshot": screenshotBody()}
	for _, size := range []int{0, 16 << 10, 256 << 10} {
		bodies[fmt.Sprintf("%dKiB", size>>10)] = conversationBody(size)
	}
	for _, name := range []string{"0KiB", "16KiB", "256KiB", "screenshot"} {
		body := bodies[name]
		for _, impl := range []struct {
			name  string
			parse func([]byte) (ModelRequest, error)
		}{{"scanner", ParseModelRequest}, {"decoder", parseModelRequestDecoder}} {
			b.Run(impl.name+"/"+name, func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := impl.parse(body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

const anthropicSSE = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","model":"claude-haiku-4-5","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`

func TestUsageParser(t *testing.T) {
	tests := []struct {
		name        string
		contentType string
		body        string
		chunk       int
		want        Usage
	}{
		{"Anthropic JSON message", "application/json", `{"id":"m","usage":{"input_tokens":12,"output_tokens":34}}`, 0, Usage{12, 34}},
		{"OpenAI chat completion", "application/json; charset=utf-8", `{"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}`, 0, Usage{7, 9}},
		{"OpenAI response object", "application/json", `{"object":"response","usage":{"input_tokens":3,"output_tokens":4}}`, 0, Usage{3, 4}},
		{"Anthropic SSE stream read in one piece", "text/event-stream", anthropicSSE, 0, Usage{30, 15}},
		{"Anthropic SSE stream split into 7-byte writes", "text/event-stream", anthropicSSE, 7, Usage{30, 15}},
		{"Anthropic SSE stream with CRLF line ends", "text/event-stream", strings.ReplaceAll(anthropicSSE, "\n", "\r\n"), 3, Usage{30, 15}},
		{"OpenAI chat stream with a usage chunk", "text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n", 5, Usage{11, 2}},
		{"OpenAI Responses stream", "text/event-stream", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":6}}}\n", 0, Usage{8, 6}},
		{"JSON without usage gives zero", "application/json", `{"error":{"type":"overloaded"}}`, 0, Usage{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewUsageParser(tt.contentType)
			require.NotNil(t, p)
			b := []byte(tt.body)
			step := tt.chunk
			if step == 0 {
				step = len(b)
			}
			for len(b) > 0 {
				n := min(step, len(b))
				_, _ = p.Write(b[:n])
				b = b[n:]
			}
			assert.Equal(t, tt.want, p.Usage())
		})
	}
	assert.Nil(t, NewUsageParser("text/html"))
}

func TestUsageParserSkipsOverlongEvents(t *testing.T) {
	p := NewUsageParser("text/event-stream")
	_, _ = p.Write([]byte("data: " + strings.Repeat("x", maxUsageSSEEvent+10) + `"usage":{"input_tokens":999}` + "\n\n"))
	_, _ = p.Write([]byte(`data: {"usage":{"input_tokens":1,"output_tokens":2}}` + "\n\n"))
	assert.Equal(t, Usage{1, 2}, p.Usage())
}

func FuzzUsageParser(f *testing.F) {
	f.Add([]byte(anthropicSSE), uint8(7))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n"), uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		s := int(step) + 1
		p := NewUsageParser("text/event-stream")
		whole := NewUsageParser("text/event-stream")
		_, _ = whole.Write(b)
		for len(b) > 0 {
			n := min(s, len(b))
			_, _ = p.Write(b[:n])
			b = b[n:]
		}
		// Chunking never changes the result.
		if p.Usage() != whole.Usage() {
			t.Fatalf("chunked %+v, whole %+v", p.Usage(), whole.Usage())
		}
	})
}

// FuzzUsageScan holds the usage scanner (with its fallback) to json.Unmarshal, the reader it
// replaced: the same counts, and usage found in the same documents.
func FuzzUsageScan(f *testing.F) {
	for _, s := range []string{
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`,
		`{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}`,
		`{"type":"response.completed","response":{"usage":{"input_tokens":4,"output_tokens":2}}}`,
		`{"usage":{"input_tokens":5},"usage":{"output_tokens":3}}`, `{"Usage":{"input_tokens":5}}`,
		`{"usage":{"input_tokens":1.5}}`, `{"usage":{"input_tokens":null,"output_tokens":-0}}`, `{"usage":null}`,
		`{"message":"text","usage":{"input_tokens":1}}`, `{"message":{"message":{}}}`, `{"u\u0073age":{"input_tokens":2}}`,
		`{"usage":{"input_tokens":99999999999999999999}}`, `{"usage":{"input_tokens":1}} x`, `null`, `[]`,
		`{ "usage" : { "input_tokens" : 7 , "output_tokens" : 8 } }`, "{\"usage\":{\"\u212aey\":1,\"input_tokens\":3}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p := &UsageParser{}
		p.doc(b)
		want, decoded := usageDecoder(b)
		if p.usage != want || p.decoded != decoded {
			t.Fatalf("%q: scanner %+v (decoded %v), json.Unmarshal %+v (decoded %v)", b, p.usage, p.decoded, want, decoded)
		}
	})
}

// BenchmarkUsageDoc is one usage-bearing document: a non-streamed Messages response and the
// message_start event of a stream.
func BenchmarkUsageDoc(b *testing.B) {
	docs := map[string]string{
		"response": `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"` +
			strings.Repeat("Here is the change you asked for. ", 60) + `"}],"stop_reason":"end_turn","stop_sequence":null,` +
			`"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":51200,"output_tokens":503,"service_tier":"standard"}}`,
		"message_start": `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5",` +
			`"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`,
	}
	for name, doc := range docs {
		for _, impl := range []struct {
			name string
			read func([]byte)
		}{
			{"scanner", func(b []byte) { (&UsageParser{}).doc(b) }},
			{"unmarshal", func(b []byte) { usageDecoder(b) }},
		} {
			b.Run(impl.name+"/"+name, func(b *testing.B) {
				doc := []byte(doc)
				b.ReportAllocs()
				for b.Loop() {
					impl.read(doc)
				}
			})
		}
	}
}
