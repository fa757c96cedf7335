package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// brokenAnswers are upstream answers Go's transport cannot read, each quoting words the
// upstream chose (canary, and the key it was sent, once it was) where its error says what it
// could not read; quoted says whether the transport's error holds them (the event's detail).
var brokenAnswers = map[string]struct {
	answer func(words string) string
	quoted bool
}{
	"/broken/status-code": {func(w string) string { return "HTTP/1.1 " + w + " OK\r\nContent-Length: 0\r\n\r\n" }, true},
	"/broken/status-line": {func(w string) string { return "HTTP/1.1" + w + "\r\nContent-Length: 0\r\n\r\n" }, true},
	"/broken/header-line": {func(w string) string { return "HTTP/1.1 200 OK\r\n" + w + "\r\nContent-Length: 0\r\n\r\n" }, true},
	"/broken/lengths-differ": {func(w string) string {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: " + w + "\r\n\r\nok"
	}, true},
	"/broken/length": {func(w string) string { return "HTTP/1.1 200 OK\r\nContent-Length: " + w + "\r\n\r\nok" }, true},
	"/broken/transfer-codings": {func(w string) string {
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: " + w + "\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
	}, true},
	"/broken/transfer-coding": {func(w string) string {
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: " + w + "\r\n\r\nok"
	}, true},
}

// unknownCoding is read only where Sandgate decodes the body (a credentialed way): a coding of
// the upstream's naming. (A field that names the key is removed before: TestEveryLineOf….)
func unknownCoding(*http.Request) string {
	return "HTTP/1.1 200 OK\r\nContent-Encoding: canary-coding\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
}

// TestSandgatesOwnWordsQuoteNoUpstream (issue 59, class 2): what Sandgate writes itself about
// an upstream's failure (the JSON error body, Proxy-Status) is a fixed text for its code,
// whatever the upstream sent: a status line, header lines, lengths, codings or a certificate
// naming the key. The transport's words (the detail) are in the event only, the key
// scrubbed there too.
func TestSandgatesOwnWordsQuoteNoUpstream(t *testing.T) {
	answers := map[string]func(*http.Request) string{}
	for path, b := range brokenAnswers {
		answers[path] = func(r *http.Request) string {
			return b.answer("canary-" + r.Header.Get("X-Api-Key") + "-words") // no key on a plain forward
		}
	}
	answers["/ok"] = func(*http.Request) string { return rawResponse("200 OK", nil, []byte("ok")) }
	answers["/unknown-coding"] = unknownCoding
	rh := newRawHarness(t, answers)
	messages := map[string]map[string]bool{} // code → the messages it was answered with
	check := func(t *testing.T, way, path string, quoted bool) {
		f := rh.get(t, way, path)
		assert.GreaterOrEqual(t, f.final.StatusCode, 500, "%q", f.raw)
		raw := strings.ToLower(string(f.raw))
		assert.NotContains(t, raw, "canary", "the upstream's words reached the sandbox: %q", f.raw)
		assert.NotContains(t, raw, strings.ToLower(realKey))
		var body struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(f.body), &body), "%q", f.body)
		if messages[body.Error.Code] == nil {
			messages[body.Error.Code] = map[string]bool{}
		}
		messages[body.Error.Code][body.Error.Message] = true
		assert.Contains(t, f.final.Header.Get("Proxy-Status"), `details="`+body.Error.Code+": "+strings.TrimPrefix(body.Error.Message, "sandgate: ")+`"`)
		ev := rh.rec.waitFor(t, func(e audit.Event) bool {
			return e.Kind == audit.KindHTTPRequest && e.Target.Path == path && e.Target.Route == route(way) && e.Outcome.Error != ""
		})
		assert.Equal(t, body.Error.Code, ev.Outcome.Error)
		assert.Equal(t, f.final.StatusCode, ev.Outcome.Status)
		if quoted {
			assert.Contains(t, ev.Outcome.Detail, "canary-", "the event keeps what failed")
		}
		assert.NotContains(t, ev.Outcome.Detail, realKey, "scrubbed in the event too")
		assert.LessOrEqual(t, len(ev.Outcome.Detail), 512)
	}
	for _, way := range via[:4] {
		for path, b := range brokenAnswers {
			t.Run(way+": "+path, func(t *testing.T) { check(t, way, path, b.quoted) })
		}
	}
	for _, way := range via[:3] {
		t.Run(way+": a coding of its own", func(t *testing.T) { check(t, way, "/unknown-coding", false) })
	}
	for _, way := range via[4:] {
		t.Run(way, func(t *testing.T) { check(t, way, "/ok", true) })
	}
	for code, ms := range messages {
		assert.Len(t, ms, 1, "code %s is answered with one fixed text: %v", code, ms)
	}
}
