package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
)

// A route whose credential is minted per run sends its requests with no header indexed: each
// run's token would be a new entry of the pooled connection's HPACK table at every request,
// evicting the others, and an indexed credential is what a compression oracle probes (RFC 7541
// §7.1.3). The upstream reads every header block as it came off the wire: with a static key
// the key is indexed once and referred to after (the test can tell), with a minted credential
// no field is ever added to the table, and each run's token still arrives.
func TestMintedCredentialIsNeverIndexedUpstream(t *testing.T) {
	for _, minted := range []bool{false, true} {
		t.Run(map[bool]string{false: "static", true: "minted"}[minted], func(t *testing.T) {
			up := startHPACKTap(t)
			h := newHarnessWith(t, func(o *Options) {
				o.UpstreamRoots.AddCert(up.ca.cert)
				if minted {
					o.Credentials = mintingStore(t)
				}
			}, func(p *config.Proxy) {
				p.Routes[0].Upstream = "https://api.anthropic.com:" + up.port
			})
			model := map[string]string{"127.0.0.2": "claude-sonnet-4-5", "127.0.0.3": "claude-haiku-4-5"} // each template's
			for _, from := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.2"} {
				body := `{"model":"` + model[from] + `","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
				resp, err := h.client(t, from).Post("http://"+h.addr+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(body))
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			blocks := up.blocks()
			require.Len(t, blocks, 4, "one header block per request")
			keys := map[string]bool{}
			indexedKey := false
			for _, b := range blocks {
				keys[b.fields["x-api-key"]] = true
				indexedKey = indexedKey || b.addedNames["x-api-key"] || b.referred > 0
				if minted {
					assert.Empty(t, b.addedNames, "no field added to the dynamic table")
					assert.Zero(t, b.referred, "no field referred to in the dynamic table")
				}
			}
			if minted {
				assert.Len(t, keys, 2, "each run's own token: %v", keys)
				assert.NotContains(t, keys, realKey)
			} else {
				assert.Equal(t, map[string]bool{realKey: true}, keys)
				assert.True(t, indexedKey, "a static key is indexed (what the minted case must not do)")
			}
		})
	}
}

// mintingStore is a credential store whose "anthropic" is minted per run by OAuth 2.0 client
// credentials at a token endpoint of this test, a new token each time.
func mintingStore(t *testing.T) *credential.Store {
	var n atomic.Int64
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":"minted-token-%06d-abcdefghijklmnop","token_type":"bearer","expires_in":3600}`, n.Add(1))
	}))
	t.Cleanup(idp.Close)
	cfg, err := config.Parse([]byte(`
credentials:
  - {name: idp-secret, env: X}
  - name: anthropic
    oauth2_client_credentials: {token_url: "`+idp.URL+`/token", client_id: sandgate, client_secret_credential: idp-secret}
`), t.TempDir())
	require.NoError(t, err)
	s := credential.FromValues(map[string]string{"idp-secret": "client-secret-0123456789"})
	require.NoError(t, s.EnableMinting(cfg, credential.MintOptions{}))
	return s
}

// hpackTap is an HTTP/2 upstream (x/net/http2's server over TLS) that keeps what the client
// sent, decrypted, and reads each header block's representations from it.
type hpackTap struct {
	ca   *CA
	port string
	mu   sync.Mutex
	in   [][]byte // what each connection's client sent
}

// tappedBlock is one request's header block: its fields, the names of those added to the
// dynamic table (literals with incremental indexing), and how many referred to an entry of it.
type tappedBlock struct {
	fields     map[string]string
	addedNames map[string]bool
	referred   int
}

func startHPACKTap(t *testing.T) *hpackTap {
	ca, _ := newTestCA(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	tap := &hpackTap{ca: ca, port: port}
	cfg := &tls.Config{NextProtos: []string{"h2"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(hi.ServerName) }}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",`+
			`"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`)
	})
	// The server is net/http's, speaking HTTP/2 on a connection whose TLS the listener ended:
	// it reads the client's bytes through the tap.
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: handler, Protocols: &protocols, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(&tapListener{Listener: ln, cfg: cfg, tap: tap}) }()
	t.Cleanup(func() { _ = srv.Close() })
	return tap
}

// tapListener ends TLS (h2 by ALPN) on each connection and hands the server its plaintext
// through a tappedConn.
type tapListener struct {
	net.Listener
	cfg *tls.Config
	tap *hpackTap
}

func (l *tapListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := tls.Server(c, l.cfg)
		if tc.Handshake() != nil {
			c.Close()
			continue
		}
		l.tap.mu.Lock()
		l.tap.in = append(l.tap.in, nil)
		i := len(l.tap.in) - 1
		l.tap.mu.Unlock()
		return &tappedConn{Conn: tc, tap: l.tap, i: i}, nil
	}
}

// tappedConn keeps what its reads returned in the tap.
type tappedConn struct {
	net.Conn
	tap *hpackTap
	i   int
}

func (c *tappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.tap.mu.Lock()
	c.tap.in[c.i] = append(c.tap.in[c.i], p[:n]...)
	c.tap.mu.Unlock()
	return n, err
}

// blocks are the header blocks of every connection's requests, in order.
func (tap *hpackTap) blocks() []tappedBlock {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	var out []tappedBlock
	for _, in := range tap.in {
		out = append(out, headerBlocks(bytes.TrimPrefix(in, []byte(http2.ClientPreface)))...)
	}
	return out
}

// headerBlocks reads the HEADERS frames (and their CONTINUATION frames) of a client's bytes.
func headerBlocks(in []byte) []tappedBlock {
	fr := http2.NewFramer(nil, bytes.NewReader(in))
	dec := hpack.NewDecoder(4096, nil)
	var out []tappedBlock
	var frag []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return out
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			frag = append([]byte(nil), f.HeaderBlockFragment()...)
			if !f.HeadersEnded() {
				continue
			}
		case *http2.ContinuationFrame:
			frag = append(frag, f.HeaderBlockFragment()...)
			if !f.HeadersEnded() {
				continue
			}
		default:
			continue
		}
		b := tappedBlock{fields: map[string]string{}, addedNames: map[string]bool{}}
		fields, err := dec.DecodeFull(frag)
		if err != nil {
			panic(err)
		}
		for _, hf := range fields {
			b.fields[hf.Name] = hf.Value
		}
		reps, err := representations(frag)
		if err != nil {
			panic(err)
		}
		for i, r := range reps {
			switch {
			case r.added:
				b.addedNames[fields[i].Name] = true
			case r.index > hpackStaticEntries:
				b.referred++
			}
		}
		out = append(out, b)
	}
}

// hpackStaticEntries is the number of entries of HPACK's static table (RFC 7541, Appendix A):
// an index above it is the dynamic table's.
const hpackStaticEntries = 61

// representation is how one field of a header block was sent: index is the table index of the
// field (indexed) or of its name (a literal; 0: the name is a literal too); added says a
// literal with incremental indexing.
type representation struct {
	index int
	added bool
}

// representations walks a header block (RFC 7541, section 6), one entry per field, skipping
// dynamic table size updates.
func representations(b []byte) ([]representation, error) {
	var out []representation
	for len(b) > 0 {
		c := b[0]
		var r representation
		var err error
		switch {
		case c&0x80 != 0: // indexed field
			r.index, b, err = hpackInt(b, 7)
			out = append(out, r)
			if err != nil {
				return nil, err
			}
			continue
		case c&0xc0 == 0x40: // literal with incremental indexing
			r.added = true
			r.index, b, err = hpackInt(b, 6)
		case c&0xe0 == 0x20: // dynamic table size update
			_, b, err = hpackInt(b, 5)
			if err != nil {
				return nil, err
			}
			continue
		default: // literal without indexing, never indexed
			r.index, b, err = hpackInt(b, 4)
		}
		if err != nil {
			return nil, err
		}
		literals := 1
		if r.index == 0 {
			literals = 2 // the name, then the value
		}
		for range literals {
			if len(b) == 0 {
				return nil, errors.New("hpack: block ends in a literal")
			}
			var n int
			n, b, err = hpackInt(b, 7) // the Huffman bit is above the prefix
			if err != nil || n > len(b) {
				return nil, errors.New("hpack: bad string length")
			}
			b = b[n:]
		}
		out = append(out, r)
	}
	return out, nil
}

// hpackInt reads an integer with an n-bit prefix (RFC 7541, section 5.1).
func hpackInt(b []byte, n uint) (int, []byte, error) {
	limit := 1<<n - 1
	v := int(b[0]) & limit
	b = b[1:]
	if v < limit {
		return v, b, nil
	}
	for m := uint(0); len(b) > 0 && m < 28; m += 7 {
		c := b[0]
		b = b[1:]
		v += int(c&0x7f) << m
		if c&0x80 == 0 {
			return v, b, nil
		}
	}
	return 0, nil, errors.New("hpack: bad integer")
}
