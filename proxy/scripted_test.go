package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// scriptedUpstream is an upstream that writes its answers byte for byte on the connection, as no
// HTTP library would: a field as several lines, a status line or a header with words of its
// own. Each path's answer is made from the request Sandgate sent (the injected key is in it);
// the connection closes after each answer.
type scriptedUpstream struct {
	port    int
	answers map[string]func(r *http.Request) string
}

// startScriptedUpstream listens on loopback, with TLS when cert is not nil.
func startScriptedUpstream(t *testing.T, cert func(*tls.ClientHelloInfo) (*tls.Certificate, error), answers map[string]func(*http.Request) string) *scriptedUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{GetCertificate: cert, NextProtos: []string{"http/1.1"}})
	}
	t.Cleanup(func() { _ = ln.Close() })
	u := &scriptedUpstream{port: ln.Addr().(*net.TCPAddr).Port, answers: answers}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c)
		}
	}()
	return u
}

func (u *scriptedUpstream) serve(c net.Conn) {
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	answer := u.answers[req.URL.Path]
	if answer == nil {
		_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	_, _ = io.WriteString(c, answer(req))
}

// rawResponse is a response's bytes: status line, the header lines as given, and body framed by
// its length (unless a line frames it), the connection closed after it.
func rawResponse(status string, lines []string, body []byte) string {
	var b strings.Builder
	b.WriteString("HTTP/1.1 " + status + "\r\n")
	framed := false
	for _, l := range lines {
		b.WriteString(l + "\r\n")
		name, _, _ := strings.Cut(l, ":")
		framed = framed || strings.EqualFold(name, "Content-Length") || strings.EqualFold(name, "Transfer-Encoding")
	}
	if !framed {
		b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	b.Write(body)
	return b.String()
}

// chunkedWithTrailer is body as one chunk followed by the trailer lines.
func chunkedWithTrailer(body []byte, trailer []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%x\r\n%s\r\n0\r\n", len(body), body)
	for _, l := range trailer {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// rawHarness is the harness with every way to the raw upstreams: the base-URL routes raw (a
// model API) and rawplain (no API), both with the key injected; raw.test intercepted (a model
// API, key injected); and plain forwarding to raw-public.test (no key). Policy allows all.
type rawHarness struct {
	*harness
	tlsUp, plainUp *scriptedUpstream
	// certUp answers alike, with a certificate for another name, which the upstream chose:
	// canaryName (the route rawcert, and raw.test intercepted at its port).
	certUp *scriptedUpstream
}

// canaryName is the name of certUp's certificate: words and the key, which an upstream knows
// once it was sent.
const canaryName = "canary-" + realKey

// via are the ways a sandbox reaches the raw upstreams; the last two reach certUp.
var via = []string{"route", "route without API", "intercepted", "forward", "route, certificate of another name", "intercepted, certificate of another name"}

func newRawHarness(t *testing.T, answers map[string]func(*http.Request) string) *rawHarness {
	rh := &rawHarness{}
	rh.harness = newHarnessWith(t, func(o *Options) { o.Policy = allowAll{} }, func(p *config.Proxy) {
		cred := &config.CredentialRef{Name: "anthropic", Header: "x-api-key", Format: "{value}"}
		// The stand-in's CA signs the raw upstream's certificate (the proxy trusts it).
		rh.tlsUp = startScriptedUpstream(t, func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return rh.up.ca.Leaf(h.ServerName) }, answers)
		rh.plainUp = startScriptedUpstream(t, nil, answers)
		rh.certUp = startScriptedUpstream(t, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return rh.up.ca.Leaf(canaryName) }, answers)
		up := "https://raw.test:" + strconv.Itoa(rh.tlsUp.port)
		p.Routes = append(p.Routes,
			config.ProxyRoute{Name: "raw", Upstream: up, API: config.APIAnthropic, AllowPrivate: true, Credential: cred},
			config.ProxyRoute{Name: "rawplain", Upstream: up, API: config.APINone, AllowPrivate: true, Credential: cred},
			config.ProxyRoute{Name: "rawcert", Upstream: "https://raw.test:" + strconv.Itoa(rh.certUp.port), API: config.APIAnthropic,
				AllowPrivate: true, Credential: cred})
		for _, port := range []int{rh.tlsUp.port, rh.certUp.port} {
			p.Hosts = append(p.Hosts, config.ProxyHost{Host: "raw.test", Port: port, Mode: config.ModeIntercept,
				API: config.APIAnthropic, AllowPrivate: true, Credential: cred})
		}
		p.Limits.TunnelsPerSandbox = 100
	})
	return rh
}

// get sends GET path the given way from sandbox alpha and reads until the proxy closes.
func (rh *rawHarness) get(t *testing.T, way, path string) fetched {
	t.Helper()
	c, br := rh.rawClient(t, alpha)
	conn := c
	var head string
	switch way {
	case "route":
		head = "GET /routes/raw" + path + " HTTP/1.1\r\nHost: sandgate\r\n"
	case "route without API":
		head = "GET /routes/rawplain" + path + " HTTP/1.1\r\nHost: sandgate\r\n"
	case "route, certificate of another name":
		head = "GET /routes/rawcert" + path + " HTTP/1.1\r\nHost: sandgate\r\n"
	case "intercepted", "intercepted, certificate of another name":
		port := rh.tlsUp.port
		if way != "intercepted" {
			port = rh.certUp.port
		}
		target := "raw.test:" + strconv.Itoa(port)
		_, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		conn = rh.sandboxTLS(t, c, "raw.test")
		head = "GET " + path + " HTTP/1.1\r\nHost: " + target + "\r\n"
	case "forward":
		target := "raw-public.test:" + strconv.Itoa(rh.plainUp.port)
		head = "GET http://" + target + path + " HTTP/1.1\r\nHost: " + target + "\r\n"
	default:
		t.Fatalf("no way %q", way)
	}
	_, err := io.WriteString(conn, head+"Connection: close\r\n\r\n")
	require.NoError(t, err)
	var f fetched
	f.raw, _ = io.ReadAll(conn)
	require.NotEmpty(t, f.raw, "the proxy answered nothing")
	rd := bufio.NewReader(bytes.NewReader(f.raw))
	resp, err := http.ReadResponse(rd, nil)
	require.NoError(t, err, "%q", f.raw)
	f.final = resp
	b, err := io.ReadAll(resp.Body)
	f.body, f.bodyErr = string(b), err
	return f
}

// route is the audit event's target.route of a way.
func route(way string) string {
	return map[string]string{"route": "raw", "route without API": "rawplain", "route, certificate of another name": "rawcert"}[way]
}
