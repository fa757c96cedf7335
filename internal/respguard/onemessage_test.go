package respguard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// messageShapes are JSON messages (an MCP result, mostly) that carry their text as several
// strings a sandbox joins: each takes the pieces and returns the message.
var messageShapes = map[string]func(p []string) string{
	"text content parts": func(p []string) string {
		var parts []string
		for _, s := range p {
			parts = append(parts, fmt.Sprintf(`{"type":"text","text":%q}`, s))
		}
		return `{"jsonrpc":"2.0","id":7,"result":{"content":[` + strings.Join(parts, ",") + `],"isError":false}}`
	},
	"content parts with annotations between": func(p []string) string {
		var parts []string
		for _, s := range p {
			parts = append(parts, fmt.Sprintf(`{"type":"text","text":%q,"annotations":{"audience":["user"],"priority":0.5}}`, s))
		}
		return `{"jsonrpc":"2.0","id":7,"result":{"content":[` + strings.Join(parts, ",") + `]}}`
	},
	"resource contents": func(p []string) string {
		var parts []string
		for i, s := range p {
			parts = append(parts, fmt.Sprintf(`{"uri":"file:///part%d","mimeType":"text/plain","text":%q}`, i, s))
		}
		return `{"jsonrpc":"2.0","id":7,"result":{"contents":[` + strings.Join(parts, ",") + `]}}`
	},
	"an array of strings": func(p []string) string {
		b, _ := json.Marshal(p)
		return `{"jsonrpc":"2.0","id":7,"result":{"content":[],"structuredContent":{"lines":` + string(b) + `}}}`
	},
	"an array of arrays": func(p []string) string {
		var rows []string
		for _, s := range p {
			rows = append(rows, fmt.Sprintf(`[%q]`, s))
		}
		return `{"rows":[` + strings.Join(rows, ",") + `]}`
	},
	"a bare array": func(p []string) string {
		b, _ := json.Marshal(p)
		return string(b)
	},
}

// stringsOf is every string value of a JSON text in document order, keys left out: what a
// sandbox joining a message's parts reads.
func stringsOf(t *testing.T, doc string) string {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(doc), &v), "%s", doc)
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			b.WriteString(x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, k := range []string{"type", "uri", "mimeType", "annotations"} {
				delete(x, k) // the parts' labels: not what a sandbox joins
			}
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return b.String()
}

// TestOneMessageIsOneStream: a credential split across the strings of one JSON message (the
// text content parts of a tool result, the items of an array) reaches no sandbox whole: a JSON
// body is read in pieces as an event stream is, at every split and in any reads.
func TestOneMessageIsOneStream(t *testing.T) {
	inPieces := InPieces(http.Header{"Content-Type": {"application/json"}})
	require.True(t, inPieces)
	for name, shape := range messageShapes {
		t.Run(name, func(t *testing.T) {
			for _, cut := range [][]int{{1}, {4}, {len(secret) / 2}, {len(secret) - 1}, {5, 17}, {4, 8, 12, 16, 20, 24}} {
				var p []string
				from := 0
				for _, c := range cut {
					p = append(p, secret[from:c])
					from = c
				}
				body := shape(append(p, secret[from:]))
				whole, _ := scrubStream(t, body, len(body), false)
				require.Contains(t, stringsOf(t, whole), secret, "read as one body without pieces, the key passes (the test means something)")
				for _, n := range []int{1, 5, 40, len(body)} {
					out, hits := scrubStream(t, body, n, inPieces)
					assert.Positive(t, hits, "cut at %v, reads of %d", cut, n)
					assert.Len(t, out, len(body))
					assert.True(t, json.Valid([]byte(out)), "%s", out)
					assert.NotContains(t, stringsOf(t, out), secret[pieceHold-1:], "cut at %v, reads of %d: %s", cut, n, out)
				}
			}
		})
	}
}
