package headguard

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/call"
)

// guard wraps a sandbox's connection and follows the HTTP/1.1 framing of the requests that
// stream past net/http's parser, to catch what that parser repairs silently: it accepts a
// request with both Content-Length and Transfer-Encoding by dropping Content-Length, which is
// what request smuggling relies on when some other hop frames the message differently.
// Sandgate refuses such requests instead (and audits them), as well as heads larger than the
// configured limit and obsolete line folding: the handler asks next() for each request.
//
// It also sees what net/http's server does without calling a handler, and makes it Sandgate's:
// a head cut by the header timeout or by the client closing (audited through onHard, as net/http
// answers neither), and net/http's own plain-text error answer to a head it cannot parse, which
// Write replaces with answer's refusal and audits (see Write). After a CONNECT or Upgrade head,
// or after a flagged head, it stops inspecting.
type guard struct {
	net.Conn
	maxHead int
	onHard  func(*call.Refusal)                   // audits a head refused before any handler sees it
	answer  func(*call.Refusal) (io.Reader, bool) // Sandgate's answer to such a head, if any

	mu    sync.Mutex
	st    int
	line  []byte // first bytes of the current line (enough for CL/TE headers)
	llen  int
	head  int // bytes of the current head
	heads int // complete heads seen
	first bool
	meth  string
	cl    int
	te    bool
	upg   bool
	rem   int64
	bad   int // 1-based index of the first refused head, 0 if none
	why   *call.Refusal

	served    atomic.Int64 // requests the handler has seen on this connection
	finished  atomic.Int64 // requests the handler has returned from
	started   int          // request heads whose first byte was read
	reported  int          // the last head audited before any handler saw it
	owed      int          // final status lines the handlers' responses have still to write
	inHead    bool         // a head began and has not ended
	continued bool         // the request being served was sent a 100 Continue
	aborting  bool         // the read deadline is in the past: net/http ending its own read
}

const (
	gsHead = iota
	gsBody
	gsChunkSize
	gsChunkData
	gsChunkEnd
	gsTrailer
	gsPass
	gsOversize // head over the limit: counted on until net/http stops reading it
)

const keepLine = 256

func newGuard(c net.Conn, maxHead int, onHard func(*call.Refusal)) *guard {
	return &guard{Conn: c, maxHead: maxHead, onHard: onHard, first: true}
}

// Read scans what net/http reads. A read that ends in a timeout or in the client going away
// while a head is half read is that head's end: net/http closes the connection without an
// answer, so the guard audits it here.
func (g *guard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	var rf *call.Refusal
	g.mu.Lock()
	if n > 0 {
		g.scan(p[:n])
	}
	if err != nil && g.midHeadLocked() && g.unservedLocked() {
		switch {
		case isTimeout(err) && !g.aborting:
			rf = &call.Refusal{Code: call.CodeHeaderTimeout, Reason: "request head not received in time"}
		case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET):
			rf = &call.Refusal{Code: call.CodeMalformedRequest, Reason: "request head cut short: the client closed the connection"}
		}
		if rf != nil {
			g.reported = g.started
		}
	}
	g.mu.Unlock()
	if rf != nil && g.onHard != nil {
		g.onHard(rf)
	}
	return n, err
}

// SetReadDeadline notes a deadline in the past: net/http sets one to end its background read
// when a handler returns or takes the connection over, and the timeout that follows is no
// client's.
func (g *guard) SetReadDeadline(t time.Time) error {
	g.mu.Lock()
	g.aborting = !t.IsZero() && t.Before(time.Now())
	g.mu.Unlock()
	return g.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline's, for both directions.
func (g *guard) SetDeadline(t time.Time) error {
	g.mu.Lock()
	g.aborting = !t.IsZero() && t.Before(time.Now())
	g.mu.Unlock()
	return g.Conn.SetDeadline(t)
}

// Write passes the server's bytes on, except net/http's own answer to a head no handler will
// see. net/http writes that answer (a plain-text 400, 417, 431, 501 or 505) in one write that
// starts with its status line, while no handler runs and no handler's response is owed a status
// line; the guard audits it and writes Sandgate's answer instead, or nothing when the head was
// audited already (cut short by the client: nobody reads the answer).
func (g *guard) Write(p []byte) (int, error) {
	status := statusLine(p) // checked first: most writes are no status line, and take no lock
	if status == http.StatusContinue {
		return g.writeContinue(p)
	}
	if status < 200 {
		return g.Conn.Write(p)
	}
	g.mu.Lock()
	if g.owed > 0 {
		g.owed-- // a handler's response
		g.mu.Unlock()
		return g.Conn.Write(p)
	}
	if !g.pendingLocked() {
		g.mu.Unlock()
		return g.Conn.Write(p) // not net/http's answer to a head: a tunnel's bytes
	}
	audited := g.reported >= g.started
	g.reported = g.started
	g.mu.Unlock()
	if audited {
		return len(p), nil
	}
	rf := refusalFor(status, p)
	if g.onHard != nil {
		g.onHard(rf)
	}
	if g.answer != nil {
		if r, ok := g.answer(rf); ok {
			if _, err := io.Copy(g.Conn, r); err != nil {
				return 0, err
			}
		}
	}
	return len(p), nil
}

// writeContinue sends the first 100 Continue of a request and drops any other: net/http sends
// one when the handler first reads the body, and a proxied upstream that was sent the Expect
// header answers with its own, which httputil.ReverseProxy forwards. A client waits for one.
func (g *guard) writeContinue(p []byte) (int, error) {
	g.mu.Lock()
	again := g.continued
	g.continued = true
	g.mu.Unlock()
	if again {
		return len(p), nil
	}
	return g.Conn.Write(p)
}

// refusalFor is the refusal behind net/http's own error answer: 431 is a head too large, every
// other status a malformed head (net/http's reason, when it gives one, is kept).
func refusalFor(status int, p []byte) *call.Refusal {
	if status == 431 {
		return &call.Refusal{Code: call.CodeHeaderTooLarge, Reason: "request head too large", Close: true}
	}
	reason := "malformed request head"
	line, _, _ := bytes.Cut(p, []byte("\r\n"))
	if _, why, ok := bytes.Cut(line, []byte(": ")); ok {
		reason += ": " + string(why[:min(len(why), 120)])
	} else if status == 417 {
		reason += ": unsupported Expect"
	} else if status == 501 {
		reason += ": unsupported Transfer-Encoding"
	}
	return &call.Refusal{Code: call.CodeMalformedRequest, Reason: reason, Close: true}
}

// statusLine is the status of an HTTP/1.x status line at the start of p, else 0.
func statusLine(p []byte) int {
	if len(p) < 12 || !bytes.HasPrefix(p, []byte("HTTP/1.")) || p[8] != ' ' {
		return 0
	}
	st, err := strconv.Atoi(string(p[9:12]))
	if err != nil || st < 100 || st > 999 {
		return 0
	}
	return st
}

// midHeadLocked reports a head of which some but not all bytes arrived (a flagged one
// included: net/http still waits for its end).
func (g *guard) midHeadLocked() bool { return g.inHead }

// pendingLocked reports a request head that began and that no handler has seen, while no
// handler runs.
func (g *guard) pendingLocked() bool {
	served := g.served.Load()
	return g.started > int(served) && g.finished.Load() == served
}

// unservedLocked is a pending head that was not audited yet.
func (g *guard) unservedLocked() bool { return g.pendingLocked() && g.reported < g.started }

// next is called by the handler once per request; it returns the refusal for this request,
// if its head was flagged. The handler's response owes the guard one status line.
func (g *guard) next() (*call.Refusal, bool) {
	i := int(g.served.Add(1))
	g.mu.Lock()
	defer g.mu.Unlock()
	g.owed++
	g.continued = false
	if g.bad != 0 && i >= g.bad {
		return g.why, true
	}
	return nil, false
}

// done is called by the handler when it returns.
func (g *guard) done() { g.finished.Add(1) }

func (g *guard) flag(r *call.Refusal) {
	if g.bad == 0 {
		g.bad, g.why = g.heads+1, r
	}
	g.st = gsPass
}

func (g *guard) scan(p []byte) {
	for len(p) > 0 {
		switch g.st {
		case gsPass:
			return
		case gsOversize:
			g.head += len(p)
			return
		case gsBody, gsChunkData:
			n := int64(len(p))
			if n > g.rem {
				n = g.rem
			}
			g.rem -= n
			p = p[n:]
			if g.rem == 0 {
				if g.st == gsBody {
					g.st = gsHead
				} else {
					g.st = gsChunkEnd
				}
			}
		default:
			i := bytes.IndexByte(p, '\n')
			seg := p
			if i >= 0 {
				seg = p[:i]
			}
			if g.st == gsHead {
				if g.head == 0 && len(bytes.TrimSpace(seg)) > 0 {
					g.started++
					g.inHead = true
				}
				g.head += len(seg)
				if i >= 0 {
					g.head++ // the line's '\n', when this read holds it
				}
				if g.head > g.maxHead && g.bad == 0 {
					g.flag(&call.Refusal{Code: call.CodeHeaderTooLarge, Reason: "request head exceeds " + strconv.Itoa(g.maxHead) + " bytes", Close: true})
					g.st = gsOversize
					continue
				}
			}
			if room := keepLine - len(g.line); room > 0 {
				g.line = append(g.line, seg[:min(room, len(seg))]...)
			}
			g.llen += len(seg)
			if i < 0 {
				return
			}
			p = p[i+1:]
			g.endLine(bytes.TrimSuffix(g.line, []byte("\r")))
			g.line, g.llen = g.line[:0], 0
		}
	}
}

func (g *guard) endLine(l []byte) {
	switch g.st {
	case gsHead:
		g.headLine(l)
	case gsChunkSize:
		sz, _, _ := bytes.Cut(l, []byte(";"))
		v, err := strconv.ParseInt(string(bytes.TrimSpace(sz)), 16, 64)
		switch {
		case err != nil || v < 0:
			g.st = gsPass // the body read fails and the connection closes
		case v == 0:
			g.st = gsTrailer
		default:
			g.rem, g.st = v, gsChunkData
		}
	case gsChunkEnd:
		g.st = gsChunkSize
	case gsTrailer:
		if len(l) == 0 {
			g.st = gsHead
		}
	}
}

func (g *guard) headLine(l []byte) {
	if g.first {
		if len(l) == 0 {
			g.head = 0 // blank lines before a request line are no request
			return
		}
		g.first = false
		m, _, _ := bytes.Cut(l, []byte(" "))
		g.meth, g.cl, g.te, g.upg = string(m), 0, false, false
		return
	}
	if len(l) == 0 {
		g.endHead()
		return
	}
	if l[0] == ' ' || l[0] == '\t' {
		g.flag(&call.Refusal{Code: call.CodeMalformedRequest, Reason: "obsolete header line folding", Close: true})
		return
	}
	name, value, ok := bytes.Cut(l, []byte(":"))
	if !ok {
		return // not a header line: net/http refuses the head (and Write audits that)
	}
	switch {
	case bytes.EqualFold(bytes.TrimSpace(name), []byte("content-length")):
		g.cl++
		if v := bytes.TrimSpace(value); g.cl == 1 {
			g.rem, _ = strconv.ParseInt(string(v), 10, 64)
		}
	case bytes.EqualFold(bytes.TrimSpace(name), []byte("transfer-encoding")):
		g.te = true
	case bytes.EqualFold(bytes.TrimSpace(name), []byte("upgrade")):
		g.upg = true
	}
}

func (g *guard) endHead() {
	g.heads++
	g.first = true
	g.head = 0
	g.inHead = false
	switch {
	case g.te && g.cl > 0:
		g.heads--
		g.flag(&call.Refusal{Code: call.CodeRequestSmuggling, Reason: "request has both Content-Length and Transfer-Encoding", Close: true})
		return
	case g.meth == "CONNECT" || g.upg:
		g.st = gsPass
	case g.te:
		g.st = gsChunkSize
	case g.cl > 0 && g.rem > 0:
		g.st = gsBody
	default:
		g.rem = 0
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
