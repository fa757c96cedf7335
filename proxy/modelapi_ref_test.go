package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// parseModelRequestDecoder is ParseModelRequest as it was written first, on encoding/json's
// Decoder: the reference the scanner is fuzzed against (FuzzParseModelRequest).
func parseModelRequestDecoder(body []byte) (ModelRequest, error) {
	mr := ModelRequest{MaxTokens: -1}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return mr, fmt.Errorf("model request body: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return mr, errors.New("model request body: not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return mr, fmt.Errorf("model request body: %w", err)
		}
		key, _ := tok.(string)
		switch {
		case slices.Contains(readKeysRef, key):
			if seen[key] {
				return mr, fmt.Errorf("model request body: key %q appears twice", key)
			}
			seen[key] = true
		default:
			for _, k := range readKeysRef {
				if strings.EqualFold(key, k) {
					return mr, fmt.Errorf("model request body: key %q reads as %q to case-insensitive decoders", key, k)
				}
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return mr, fmt.Errorf("model request body: %w", err)
			}
			continue
		}
		switch key {
		case "model":
			if err := dec.Decode(&mr.Model); err != nil {
				return mr, errors.New("model request body: model is not a string")
			}
		case "stream":
			var v any
			if err := dec.Decode(&v); err != nil {
				return mr, fmt.Errorf("model request body: %w", err)
			}
			switch b := v.(type) {
			case bool:
				mr.Stream = b
			case nil:
			default:
				return mr, errors.New("model request body: stream is not a boolean")
			}
		default:
			var n json.Number
			if err := dec.Decode(&n); err != nil {
				return mr, fmt.Errorf("model request body: %s is not a number", key)
			}
			if n == "" { // null
				continue
			}
			v, err := n.Int64()
			if err != nil || v < 0 {
				return mr, fmt.Errorf("model request body: %s is not a non-negative integer", key)
			}
			mr.MaxTokens = max(mr.MaxTokens, v)
		}
	}
	if _, err := dec.Token(); err != nil {
		return mr, fmt.Errorf("model request body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return mr, errors.New("model request body: data after the JSON object")
	}
	return mr, nil
}

// readKeysRef are the keys the reference reads: a top-level key equal to one of them under
// Unicode case folding, but not exactly it, is refused (Go's encoding/json would read it as the
// field).
var readKeysRef = []string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens"}

// usageDecoder is UsageParser.doc as it was written first, all json.Unmarshal: the reference
// FuzzUsageScan holds scanUsage to.
func usageDecoder(b []byte) (Usage, bool) {
	var d usageDoc
	if json.Unmarshal(b, &d) != nil {
		return Usage{}, false
	}
	var u Usage
	decoded := false
	for _, f := range []*usageDoc{&d, d.Message, d.Response} {
		if f == nil || f.Usage == nil {
			continue
		}
		x := f.Usage
		decoded = true
		u.In = max(u.In, x.InputTokens+x.CacheCreationInputTokens+x.CacheReadInputTokens, x.PromptTokens)
		u.Out = max(u.Out, x.OutputTokens, x.CompletionTokens)
	}
	return u, decoded
}
