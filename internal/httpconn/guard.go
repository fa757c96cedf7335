package httpconn

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/sandgate/sandgate/internal/call"
)

// guard wraps a sandbox's connection and follows the HTTP/1.1 framing of the requests
// that stream past http.ReadRequest, to catch what that parser repairs silently: it accepts a
// request with both Content-Length and Transfer-Encoding by dropping Content-Length, which is
// what request smuggling relies on when some other hop frames the message differently.
// Sandgate refuses such requests instead (and audits them), as well as heads larger than the
// configured limit and obsolete line folding: the handler asks next() for each request. The
// guard also audits, through onHard, a head cut by the header timeout and one grown past what
// the reader reads; the reader (Server) audits the other heads it refuses itself, after
// Claim() says the guard did not. After a CONNECT or Upgrade head, or after a flagged head, it
// stops inspecting.
type guard struct {
	net.Conn
	maxHead int
	// onHard audits a head the guard refuses before any handler sees it, and returns the
	// refusal to answer it with (Server.Reject).
	onHard func(*call.Refusal) *call.Refusal
	// answer is what onHard said to answer the head the guard audited last with.
	answer *call.Refusal

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

	served   atomic.Int64 // requests the handler has seen on this connection
	finished atomic.Int64 // requests the handler has returned from
	started  int          // request heads whose first byte was read
	reported int          // the last head audited before any handler saw it
}

const (
	gsHead = iota
	gsBody
	gsChunkSize
	gsChunkData
	gsChunkEnd
	gsTrailer
	gsPass
	gsOversize // head over the limit: count on to see whether the reader stops reading it
)

const keepLine = 256

func newGuard(c net.Conn, maxHead int, onHard func(*call.Refusal) *call.Refusal) *guard {
	return &guard{Conn: c, maxHead: maxHead, onHard: onHard, first: true}
}

func (g *guard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	var rf *call.Refusal
	g.mu.Lock()
	if n > 0 {
		g.scan(p[:n])
	}
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() && g.unservedLocked() {
		// The reader closes a connection whose head did not arrive within the header timeout
		// without an answer and without calling the handler.
		g.reported = g.started
		rf = &call.Refusal{Code: call.CodeHeaderTimeout, Reason: "request head not received in time"}
	}
	g.mu.Unlock()
	if rf != nil && g.onHard != nil {
		g.onHard(rf)
	}
	return n, err
}

// unservedLocked reports a request head that began, that no handler has seen, while no handler
// runs, and that was not audited yet. After a CONNECT or Upgrade (gsPass) the bytes are a
// tunnel's and are not inspected.
func (g *guard) unservedLocked() bool {
	served := g.served.Load()
	return g.st != gsPass && g.started > int(served) && g.finished.Load() == served && g.reported < g.started
}

// hardAnswer is the refusal to answer the head the guard audited itself with, nil if none.
func (g *guard) hardAnswer() *call.Refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.answer
}

// done is called by the handler when it returns.
func (g *guard) done() { g.finished.Add(1) }

// next is called by the handler once per request; it returns the refusal for this request,
// if its head was flagged.
func (g *guard) next() (*call.Refusal, bool) {
	i := int(g.served.Add(1))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bad != 0 && i >= g.bad {
		return g.why, true
	}
	return nil, false
}

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
			// the Server reads at most 2*maxHead (+4096) of a head, then answers 431 and
			// never calls the handler: audit that refusal here.
			if g.head > 2*g.maxHead && g.served.Load() < int64(g.bad) {
				g.st = gsPass
				g.reported = g.started
				if g.onHard != nil {
					g.answer = g.onHard(g.why)
				}
			}
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
			g.endLine(bytes.TrimSuffix(g.line, []byte("\r")), g.llen)
			g.line, g.llen = g.line[:0], 0
		}
	}
}

func (g *guard) endLine(l []byte, n int) {
	switch g.st {
	case gsHead:
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
			return // not a header line: http.ReadRequest refuses the head (and the Server audits that)
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
	_ = n
}

func (g *guard) endHead() {
	g.heads++
	g.first = true
	g.head = 0
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

// claim marks the head being read as audited by its reader and reports whether it still had to
// be: false when the guard audited it already (a header timeout, a head past the read limit).
// With begun, a head of which only blank lines arrived is not claimed either.
func (g *guard) claim(begun bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	unserved := g.started > int(g.served.Load())
	if unserved && g.reported >= g.started || begun && !unserved {
		return false
	}
	g.reported = g.started
	return true
}
