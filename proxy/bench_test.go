package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BenchmarkRoutedRequest compares one Anthropic Messages request made directly to the TLS
// stand-in with the same request through Sandgate's base-URL route (policy decision, body
// parse, credential injection, usage parsing, audit event to the real file writer).
func BenchmarkRoutedRequest(b *testing.B) {
	h := newHarness(b)
	body := `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	run := func(b *testing.B, c *http.Client, url string) {
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Api-Key", "sk-placeholder")
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	b.Run("direct", func(b *testing.B) {
		roots := x509.NewCertPool()
		roots.AddCert(h.up.ca.cert)
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "api.anthropic.com"},
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
		defer tr.CloseIdleConnections()
		run(b, &http.Client{Transport: tr}, "https://"+h.up.addr+"/v1/messages")
	})
	b.Run("via_sandgate", func(b *testing.B) {
		// Sandbox sdk-1 (127.0.0.1, template beta) may use haiku; plain HTTP to the route, as
		// a sandbox with ANTHROPIC_BASE_URL does.
		tr := &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, MaxIdleConnsPerHost: 4}
		defer tr.CloseIdleConnections()
		run(b, &http.Client{Transport: tr}, "http://"+h.addr+"/routes/anthropic/v1/messages")
	})
}

// BenchmarkConversation sends the request agents send most, the whole conversation so far
// (64 KiB, streamed answer), from sandbox alpha-1 through the base-URL route.
func BenchmarkConversation(b *testing.B) {
	h := newHarness(b)
	body := conversationBody(64 << 10)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	b.Run("64KiB", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+h.addr+"/routes/anthropic/v1/messages", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
