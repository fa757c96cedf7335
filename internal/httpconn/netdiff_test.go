package httpconn

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/call"
)

// The differential test of Server against the library it replaces: the same bytes sent to
// Server and to net/http's server, each running the same handler, must be framed into the same
// requests and answered the same way. Server may refuse more than net/http (a head its guard
// flags: Content-Length beside Transfer-Encoding, obsolete folding, a head over the limit), and
// it answers a head net/http refuses with Sandgate's refusal rather than net/http's text; it
// must never serve a request net/http would not, nor frame one differently.
//
// Three differences are deliberate and allowed here: Server drops request trailers the head did
// not declare in a Trailer header (net/http hands them to the handler; nothing of Sandgate's
// reads them, and the proxy strips credential headers, not trailers); it closes an HTTP/1.0
// connection after a response whose length it did not know, where net/http, having buffered
// the whole body, sends a Content-Length and keeps the connection; and it refuses an HTTP/1.1
// head whose Host is empty, which net/http serves (checkHead).

// seen is what the shared handler saw of one request.
type seen struct {
	Method, URI, Proto, Host string
	Header                   string // canonical, sorted, without the hop-by-hop Connection
	Body                     string // sha256 of the body read, and the read's error
	Trailer                  string
}

// recorder is the shared handler: it records each request per client connection and answers
// with a body that names what it saw.
type recorder struct {
	mu   sync.Mutex
	seen map[string][]seen // by the client's address
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(r.Body, 1<<20))
	body := fmt.Sprintf("%d:%s:%v", n, hex.EncodeToString(h.Sum(nil))[:16], err != nil)
	var hdr []string
	for k, vv := range r.Header {
		if k != "Connection" {
			hdr = append(hdr, k+"="+strings.Join(vv, ","))
		}
	}
	slices.Sort(hdr)
	var tr []string
	for k, vv := range r.Trailer {
		if declared(r.Header, k) {
			tr = append(tr, k+"="+strings.Join(vv, ","))
		}
	}
	slices.Sort(tr)
	s := seen{Method: r.Method, URI: r.RequestURI, Proto: r.Proto, Host: r.Host, Header: strings.Join(hdr, "\n"), Body: body, Trailer: strings.Join(tr, "\n")}
	rec.mu.Lock()
	rec.seen[r.RemoteAddr] = append(rec.seen[r.RemoteAddr], s)
	rec.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	_, _ = fmt.Fprintf(w, "%s %s %s", s.Method, s.URI, s.Body)
}

// declared reports trailer k named in h's Trailer header.
func declared(h http.Header, k string) bool {
	for _, v := range h.Values("Trailer") {
		for _, name := range strings.Split(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(name)) == k {
				return true
			}
		}
	}
	return false
}

// take returns what was seen on the connection from addr and forgets it: the client's port is
// reused by later connections.
func (rec *recorder) take(addr string) []seen {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	s := rec.seen[addr]
	delete(rec.seen, addr)
	return s
}

// diffServers are the two servers under the differential test, on loopback.
type diffServers struct {
	ownRec, libRec   *recorder // one per server: a client port is reused across both
	own, lib         string    // listener addresses: Server's, net/http's
	mu               sync.Mutex
	flagged, refused map[string][]string // Server's refusals by client address: flagged heads, heads refused before a request
}

const diffMaxHead = 4096

func startDiffServers(t testing.TB) *diffServers {
	d := &diffServers{ownRec: &recorder{seen: map[string][]seen{}}, libRec: &recorder{seen: map[string][]seen{}}, flagged: map[string][]string{}, refused: map[string][]string{}}
	note := func(m map[string][]string, addr, code string) {
		d.mu.Lock()
		m[addr] = append(m[addr], code)
		d.mu.Unlock()
	}
	own := &Server{Handler: d.ownRec, MaxHeaderBytes: diffMaxHead, HeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second,
		Flagged: func(w http.ResponseWriter, r *http.Request, rf *call.Refusal) {
			note(d.flagged, r.RemoteAddr, rf.Code)
			w.Header().Set("Connection", "close")
			http.Error(w, "refused: "+rf.Code, rf.Status())
		},
		Reject: func(c net.Conn, rf *call.Refusal) *call.Refusal {
			note(d.refused, c.RemoteAddr().String(), rf.Code)
			return rf
		},
		Refusal: func(rf *call.Refusal) *http.Response {
			b := "refused: " + rf.Code
			return &http.Response{StatusCode: rf.Status(), ProtoMajor: 1, ProtoMinor: 1, Close: true,
				Header: http.Header{}, Body: io.NopCloser(strings.NewReader(b)), ContentLength: int64(len(b))}
		}}
	lib := &http.Server{Handler: d.libRec, MaxHeaderBytes: 2 * diffMaxHead, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second,
		DisableGeneralOptionsHandler: true, ErrorLog: log.New(io.Discard, "", 0)}
	ctx, cancel := context.WithCancel(context.Background())
	for _, srv := range []func(net.Listener) error{
		func(ln net.Listener) error { return own.Serve(ctx, ln, time.Second) },
		lib.Serve,
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		if d.own == "" {
			d.own = ln.Addr().String()
		} else {
			d.lib = ln.Addr().String()
		}
		go func() { _ = srv(ln) }()
	}
	t.Cleanup(func() { cancel(); _ = lib.Close() })
	return d
}

// exchange sends raw on a new connection to addr, closes its sending side and reads every byte
// the server writes until it closes; it returns those bytes and the client's address.
func exchange(t testing.TB, addr string, raw []byte) ([]byte, string) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() {
		_, _ = c.Write(raw)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	out, _ := io.ReadAll(c)
	return out, c.LocalAddr().String()
}

// answer is one final response read from a server's bytes: its status and body, and whether it
// closed the connection.
type answer struct {
	status int
	body   string
	close  bool
}

// answers parses out as the responses to methods, in order, skipping 1xx; it stops at the first
// bytes that are no response.
func answers(out []byte, methods []string) []answer {
	br := bufio.NewReader(bytes.NewReader(out))
	var got []answer
	for i := 0; ; {
		m := http.MethodGet
		if i < len(methods) {
			m = methods[i]
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: m})
		if err != nil {
			return got
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return got
		}
		if resp.StatusCode < 200 {
			continue
		}
		got = append(got, answer{resp.StatusCode, string(b), resp.Close})
		i++
	}
}

// compare checks Server's handling of raw against net/http's and returns what differs.
func (d *diffServers) compare(t testing.TB, raw []byte) string {
	libOut, libAddr := exchange(t, d.lib, raw)
	ownOut, ownAddr := exchange(t, d.own, raw)
	libSeen, ownSeen := d.libRec.take(libAddr), d.ownRec.take(ownAddr)
	d.mu.Lock()
	flagged, refused := d.flagged[ownAddr], d.refused[ownAddr]
	delete(d.flagged, ownAddr)
	delete(d.refused, ownAddr)
	d.mu.Unlock()
	if len(ownSeen) > len(libSeen) {
		return fmt.Sprintf("Server served %d requests, net/http %d: %+v", len(ownSeen), len(libSeen), ownSeen[len(libSeen):])
	}
	for i := range ownSeen {
		if ownSeen[i] != libSeen[i] {
			return fmt.Sprintf("request %d framed differently:\n Server:   %+v\n net/http: %+v", i, ownSeen[i], libSeen[i])
		}
	}
	// Each side's answers are read as the responses to the requests it served; an answer past
	// those (a refusal) is read with its body.
	methods := func(ss []seen) []string {
		m := make([]string, len(ss))
		for i, s := range ss {
			m[i] = s.Method
		}
		return m
	}
	libAns, ownAns := answers(libOut, methods(libSeen)), answers(ownOut, methods(ownSeen))
	for i := range min(len(ownSeen), len(ownAns), len(libAns)) {
		if ownAns[i].status != libAns[i].status || ownAns[i].body != libAns[i].body {
			return fmt.Sprintf("answer %d differs: Server %+v, net/http %+v", i, ownAns[i], libAns[i])
		}
	}
	if len(ownAns) < len(ownSeen) && len(libAns) >= len(ownSeen) {
		return fmt.Sprintf("Server answered %d of the %d requests it served; net/http %d", len(ownAns), len(ownSeen), len(libAns))
	}
	closed10 := len(ownSeen) > 0 && len(ownAns) >= len(ownSeen) && ownAns[len(ownSeen)-1].close && ownSeen[len(ownSeen)-1].Proto == "HTTP/1.0"
	emptyHost := len(ownSeen) < len(libSeen) && libSeen[len(ownSeen)].Host == "" && libSeen[len(ownSeen)].Proto == "HTTP/1.1" && len(refused) > 0
	if len(ownSeen) < len(libSeen) && len(flagged) == 0 && !closed10 && !emptyHost {
		return fmt.Sprintf("Server served %d requests, net/http %d, and no head was flagged (refused before a request: %v)", len(ownSeen), len(libSeen), refused)
	}
	// What follows the requests both served is a refusal, from either: Server's never reads as
	// a success, and it is one Sandgate decided (a flagged head, or a head refused and audited).
	for _, a := range ownAns[min(len(ownSeen), len(ownAns)):] {
		if a.status < 400 || !strings.HasPrefix(a.body, "refused: ") {
			return fmt.Sprintf("after the served requests Server answered %+v", a)
		}
	}
	if len(ownAns) > len(ownSeen) && len(flagged)+len(refused) == 0 {
		return "Server answered a refusal it did not audit"
	}
	return ""
}

// FuzzServerFramesAsNetHTTP holds Server to net/http's server on arbitrary bytes (see above).
func FuzzServerFramesAsNetHTTP(f *testing.F) {
	for _, s := range []string{
		"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: y\r\nConnection: close\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /n HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET /n HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
		"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"GET /f HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\nGET /after HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /after HTTP/1.0\r\n\r\n",
		"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
		"GET /e HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n",
		"GET http://other/abs?q=1 HTTP/1.1\r\nHost: x\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
		"\r\n\r\nGET /after-blank HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET /a HTTP/2.0\r\nHost: x\r\n\r\n",
		"GET /a\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("v", 5000) + "\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("v", 20000) + "\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x",
		"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nshort",
		"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"GET /a HTTP/1.1\nHost: x\n\n",
		"GET /a HTTP/1.1\r\nHost:\r\n\r\n",
		"HEAD * HTTP/1.1\nHost:\n\n",
		"POST /p HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
	} {
		f.Add([]byte(s))
	}
	d := startDiffServers(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if diff := d.compare(t, raw); diff != "" {
			t.Fatalf("%q\n%s", raw, diff)
		}
	})
}
