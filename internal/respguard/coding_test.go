package respguard_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

const secret = "sk-ant-REAL-0123456789abcdef"

func TestDecodeEveryCodingAndStacks(t *testing.T) {
	body := []byte(`{"echo":"` + secret + `"}`)
	for _, stack := range [][]string{{"gzip"}, {"x-gzip"}, {"deflate"}, {"deflate-raw"}, {"br"}, {"zstd"},
		{"gzip", "br"}, {"zstd", "deflate", "gzip"}, {"br", "br"}, {"identity", "gzip"}} {
		t.Run(strings.Join(stack, ","), func(t *testing.T) {
			enc, header := respguardtest.Encode(body, stack...)
			resp := &http.Response{Header: http.Header{"Content-Encoding": {header}, "Content-Length": {"1"}},
				Body: io.NopCloser(bytes.NewReader(enc)), ContentLength: 1}
			require.NoError(t, respguard.Decode(resp))
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, body, got)
			assert.Empty(t, resp.Header.Get("Content-Encoding"))
			assert.Empty(t, resp.Header.Get("Content-Length"))
			assert.EqualValues(t, -1, resp.ContentLength)
		})
	}
}

func TestDecodeRefusesUnknownCodings(t *testing.T) {
	for _, ce := range []string{"compress", "gzip, snappy", "aes128gcm", "exi"} {
		resp := &http.Response{Header: http.Header{"Content-Encoding": {ce}}, Body: io.NopCloser(strings.NewReader("x"))}
		assert.ErrorIs(t, respguard.Decode(resp), respguard.ErrEncoding, ce)
	}
}

func TestDecodeBombIsRefusedWhileRead(t *testing.T) {
	enc, header := respguardtest.Encode(bytes.Repeat([]byte{0}, 64<<20), "gzip", "gzip")
	resp := &http.Response{Header: http.Header{"Content-Encoding": {header}}, Body: io.NopCloser(bytes.NewReader(enc))}
	require.NoError(t, respguard.Decode(resp))
	n, err := io.Copy(io.Discard, resp.Body)
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
	assert.Less(t, n, int64(64<<20), "refused before the end")
}

func TestLimit(t *testing.T) {
	b := respguard.Limit(io.NopCloser(strings.NewReader(strings.Repeat("x", 100))), 10, "body")
	_, err := io.ReadAll(b)
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
	b = respguard.Limit(io.NopCloser(strings.NewReader(strings.Repeat("x", 10))), 10, "body")
	got, err := io.ReadAll(b)
	assert.NoError(t, err)
	assert.Len(t, got, 10)
}
