package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

// TestModelRequestBodies runs request bodies through the base-URL route: what the policy reads
// from them, what reaches the upstream, and the refusals, each audited.
func TestModelRequestBodies(t *testing.T) {
	const limit = 512 << 10
	h := newHarness(t, func(p *config.Proxy) { p.Limits.BodyBytes = limit })
	const alpha = "127.0.0.2" // template alpha: claude-sonnet-4-5 only
	post := func(t *testing.T, body string, chunked bool) *http.Response {
		t.Helper()
		c, br := h.rawClient(t, alpha)
		head := "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: sandgate\r\nContent-Type: application/json\r\n"
		if chunked {
			// One chunk is enough: the server does not know the length in advance.
			_, err := io.WriteString(c, head+"Transfer-Encoding: chunked\r\n\r\n"+
				strconv.FormatInt(int64(len(body)), 16)+"\r\n"+body+"\r\n0\r\n\r\n")
			require.NoError(t, err)
		} else {
			_, err := io.WriteString(c, head+"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
			require.NoError(t, err)
		}
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}

	t.Run("a conversation-sized body reaches the upstream byte for byte", func(t *testing.T) {
		for _, chunked := range []bool{false, true} {
			body := string(conversationBody(300 << 10))
			require.Less(t, len(body), limit)
			resp := post(t, body, chunked)
			require.Equal(t, http.StatusOK, resp.StatusCode, "chunked=%v", chunked)
			assert.True(t, h.up.receivedBody(sha256.Sum256([]byte(body))), "upstream got a different body (chunked=%v)", chunked)
			h.rec.waitFor(t, func(e audit.Event) bool {
				return e.Decision.Allow && e.Target.Model == "claude-sonnet-4-5" && e.Outcome.BytesIn == int64(len(body))
			})
		}
	})

	t.Run("a body with spaces after colons and commas, as Python's json.dumps writes, is read", func(t *testing.T) {
		body := `{"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}`
		resp := post(t, body, false)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.True(t, h.up.receivedBody(sha256.Sum256([]byte(body))))
	})

	t.Run("the policy reads the model a large body names", func(t *testing.T) {
		var doc map[string]any
		require.NoError(t, json.Unmarshal(conversationBody(64<<10), &doc))
		doc["model"] = "claude-opus-4-1" // not allowed for alpha
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		resp := post(t, string(b), false)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		h.rec.waitFor(t, func(e audit.Event) bool { return !e.Decision.Allow && e.Target.Model == "claude-opus-4-1" })
	})

	refusals := []struct {
		name, body string
		chunked    bool
		status     int
		code       string
	}{
		{"a model key repeated under an escape is refused", `{"model":"claude-sonnet-4-5","mod\u0065l":"claude-opus-4-1","max_tokens":1}`,
			false, http.StatusBadRequest, "bad_model_request"},
		{"invalid JSON deep in the conversation is refused", `{"model":"claude-sonnet-4-5","messages":[{"content":"a` + "\x01" + `"}]}`,
			false, http.StatusBadRequest, "bad_model_request"},
		{"a second JSON document after the first is refused", `{"model":"claude-sonnet-4-5"}{"model":"claude-opus-4-1"}`,
			false, http.StatusBadRequest, "bad_model_request"},
		{"a body over the limit with its length declared is refused", `{"model":"claude-sonnet-4-5","pad":"` + strings.Repeat("a", limit) + `"}`,
			false, http.StatusRequestEntityTooLarge, "body_too_large"},
		{"a chunked body over the limit is refused", `{"model":"claude-sonnet-4-5","pad":"` + strings.Repeat("a", limit) + `"}`,
			true, http.StatusRequestEntityTooLarge, "body_too_large"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.rec.all())
			resp := post(t, tc.body, tc.chunked)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.False(t, h.up.receivedBody(sha256.Sum256([]byte(tc.body))), "a refused body reached the upstream")
			require.Eventually(t, func() bool {
				for _, e := range h.rec.all()[before:] {
					if e.Outcome.Error == tc.code && !e.Decision.Allow && e.Outcome.Status == tc.status {
						return true
					}
				}
				return false
			}, 5*time.Second, 20*time.Millisecond, "no audit event with outcome %s", tc.code)
		})
	}
}

func TestReadBody(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name        string
		size        int
		declared    int64
		wantLen     int
		maxCapacity int
	}{
		{"declared length, read into one buffer of that size", 100 << 10, 100 << 10, 100 << 10, 100<<10 + 1},
		{"declared length beyond the preallocation", 300 << 10, 300 << 10, 300 << 10, 0},
		{"unknown length", 70 << 10, -1, 70 << 10, 0},
		{"over the limit: one byte more than the limit", limit + 10, -1, limit + 1, 0},
		{"declared over the limit", limit + 10, limit + 10, limit + 1, 0},
		{"empty", 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := bytes.Repeat([]byte("x"), tc.size)
			got, err := readBody(bytes.NewReader(src), tc.declared, limit)
			require.NoError(t, err)
			assert.Len(t, got, tc.wantLen)
			assert.Equal(t, src[:tc.wantLen], got)
			if tc.maxCapacity > 0 {
				assert.LessOrEqual(t, cap(got), tc.maxCapacity)
			}
		})
	}
	t.Run("a declared length allocates no more than maxBodyPrealloc up front", func(t *testing.T) {
		// The client declares the limit and has sent 10 bytes when the connection fails.
		r := io.MultiReader(bytes.NewReader([]byte("0123456789")), iotest.ErrReader(io.ErrUnexpectedEOF))
		_, err := readBody(r, limit, limit)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		buf, err := readBody(bytes.NewReader([]byte("0123456789")), limit, limit)
		require.NoError(t, err)
		assert.LessOrEqual(t, cap(buf), maxBodyPrealloc+1)
	})
}
