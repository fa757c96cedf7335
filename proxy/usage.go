package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/sandgate/sandgate/internal/jsonscan"
	"github.com/sandgate/sandgate/internal/mediatype"
	"github.com/sandgate/sandgate/internal/sse"
)

// Usage is the token usage a model API reported in its response.
type Usage struct {
	In, Out int64
}

const (
	maxUsageJSON = 1 << 20 // a JSON response larger than this is not parsed for usage
	// An SSE event larger than this is skipped. It is the stream end's bound (the two read one
	// parse): OpenAI's response.completed carries the whole response and its usage.
	maxUsageSSEEvent = maxEndEvent
)

// UsageParser reads token usage from a response body as it streams past: Write is fed the
// bytes the client receives, Usage gives the result once the body ended. It never holds more
// than one SSE event (read by internal/sse, as the client reads it) or maxUsageJSON bytes of a
// JSON body.
//
// It understands Anthropic Messages (usage, message_start's message.usage, message_delta's
// cumulative usage), OpenAI Chat Completions (usage.prompt_tokens/completion_tokens, also in
// the final stream chunk) and OpenAI Responses (usage, response.completed's response.usage).
// Input tokens include Anthropic's cache reads and writes.
type UsageParser struct {
	sse     bool
	json    bool
	events  sse.Parser
	buf     []byte
	tooBig  bool
	usage   Usage
	decoded bool
	end     *streamEnd // reads the events too (streamEnd.follow)
}

// NewUsageParser returns a parser for a response of the given Content-Type, or nil when the
// type carries no usage (neither JSON nor SSE).
func NewUsageParser(contentType string) *UsageParser {
	mt, _ := mediatype.Of(contentType)
	switch {
	case mt == "text/event-stream":
		return &UsageParser{sse: true, events: sse.Parser{Max: maxUsageSSEEvent, SkipOversized: true}}
	case mt == "application/json" || len(mt) > 5 && mt[len(mt)-5:] == "+json":
		return &UsageParser{json: true}
	}
	return nil
}

// Write implements io.Writer; it never fails.
func (u *UsageParser) Write(p []byte) (int, error) {
	n := len(p)
	if u.json {
		if !u.tooBig {
			if len(u.buf)+len(p) > maxUsageJSON {
				u.tooBig, u.buf = true, nil
			} else {
				u.buf = append(u.buf, p...)
			}
		}
		return n, nil
	}
	_, _ = u.events.Feed(p, func(ev sse.Event) bool {
		u.event(ev)
		return true
	})
	return n, nil
}

// feedEvent feeds p to an SSE parser until the end of one event: it returns how much of p it
// read and whether an event ended there.
func (u *UsageParser) feedEvent(p []byte) (int, bool) {
	ended := false
	n, _ := u.events.Feed(p, func(ev sse.Event) bool {
		u.event(ev)
		ended = true
		return false
	})
	return n, ended
}

// event reads one SSE event: only data that mentions usage is decoded.
func (u *UsageParser) event(ev sse.Event) {
	if u.end != nil {
		u.end.see(ev)
	}
	data := ev.Data
	if bytes.Contains(data, []byte(`"usage"`)) {
		u.doc(bytes.TrimSpace(data))
	}
}

type usageFields struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	PromptTokens             int64 `json:"prompt_tokens"`
	CompletionTokens         int64 `json:"completion_tokens"`
}

type usageDoc struct {
	Usage    *usageFields `json:"usage"`
	Message  *usageDoc    `json:"message"`
	Response *usageDoc    `json:"response"`
}

func (u *UsageParser) doc(b []byte) {
	d, ok := scanUsage(b)
	if !ok {
		d = usageDoc{}
		if json.Unmarshal(b, &d) != nil {
			return
		}
	}
	for _, f := range []*usageDoc{&d, d.Message, d.Response} {
		if f == nil || f.Usage == nil {
			continue
		}
		x := f.Usage
		u.decoded = true
		u.usage.In = max(u.usage.In, x.InputTokens+x.CacheCreationInputTokens+x.CacheReadInputTokens, x.PromptTokens)
		u.usage.Out = max(u.usage.Out, x.OutputTokens, x.CompletionTokens)
	}
}

// errLeaveToJSON stops scanUsage at something it leaves to encoding/json.
var errLeaveToJSON = errors.New("leave to encoding/json")

// scanUsage reads b into a usageDoc exactly as json.Unmarshal would, for the documents model
// APIs send, without decoding what usage does not need (a response's content, an SSE event's
// text). ok is false when b holds anything it leaves to json.Unmarshal: a key at the levels it
// reads that is not plain lowercase ASCII (encoding/json matches keys without regard to case),
// a repeated usage, message or response, a value of another type, or invalid JSON.
func scanUsage(b []byte) (d usageDoc, ok bool) {
	s := jsonscan.New(b)
	s.Space()
	if s.Peek() != '{' {
		return d, false
	}
	if s.Object(1, d.member(1, true)) != nil {
		return d, false
	}
	s.Space()
	return d, s.AtEnd()
}

// member reads the members of a usageDoc at depth; message and response are read at the top.
func (d *usageDoc) member(depth int, top bool) func(key []byte, escaped bool, val []byte) error {
	var seen [3]bool
	return func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.LowerKey(key, escaped)
		if !ok {
			return errLeaveToJSON
		}
		var i int
		switch string(name) {
		case "usage":
			i = 0
		case "message":
			i = 1
		case "response":
			i = 2
		default:
			return nil
		}
		if seen[i] || i > 0 && !top {
			return errLeaveToJSON
		}
		seen[i] = true
		if string(val) == "null" {
			return nil
		}
		sub := jsonscan.New(val)
		if i == 0 {
			d.Usage = &usageFields{}
			return sub.Object(depth+1, d.Usage.member)
		}
		doc := &usageDoc{}
		if i == 1 {
			d.Message = doc
		} else {
			d.Response = doc
		}
		return sub.Object(depth+1, doc.member(depth+1, false))
	}
}

// member reads one member of a usage object: the counts are integers or null.
func (f *usageFields) member(key []byte, escaped bool, val []byte) error {
	name, ok := jsonscan.LowerKey(key, escaped)
	if !ok {
		return errLeaveToJSON
	}
	var dst *int64
	switch string(name) {
	case "input_tokens":
		dst = &f.InputTokens
	case "output_tokens":
		dst = &f.OutputTokens
	case "cache_creation_input_tokens":
		dst = &f.CacheCreationInputTokens
	case "cache_read_input_tokens":
		dst = &f.CacheReadInputTokens
	case "prompt_tokens":
		dst = &f.PromptTokens
	case "completion_tokens":
		dst = &f.CompletionTokens
	default:
		return nil
	}
	if string(val) == "null" {
		return nil
	}
	v, err := strconv.ParseInt(string(val), 10, 64)
	if err != nil {
		return errLeaveToJSON
	}
	*dst = v
	return nil
}

// Usage returns the usage seen so far; for a JSON body it decodes the buffered body once.
func (u *UsageParser) Usage() Usage {
	if u == nil {
		return Usage{}
	}
	if u.json && !u.tooBig && u.buf != nil {
		u.doc(u.buf)
		u.buf = nil
	}
	if u.sse { // an event the stream ended inside still reports the tokens spent
		u.events.End(func(ev sse.Event) bool { u.event(ev); return true })
	}
	return u.usage
}
