package proxy

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
)

// Response scrubbing keeps security invariant 1 on every response the proxy relays (base-URL
// routes, intercepted tunnels, plain-HTTP forwards): no credential value reaches a sandbox in a
// header, a trailer, a 1xx response or the body, whatever the upstream echoes back.
//
//   - Headers, trailers and the headers of forwarded 1xx responses: a field whose value
//     contains a needle is removed.
//   - Bodies are scanned as they stream: a needle is overwritten in place by redactionMarker cut
//     or padded with '*' to the needle's length, so Content-Length stays true. A needle split
//     across reads is caught: the scrubber holds back the longest suffix of what it read that
//     could begin a needle (at most the longest needle's length minus one byte) and nothing
//     else, so an SSE event is passed on as soon as it arrived.
//
// The needles are every credential value (re-read from the store for every response, so a
// rotated value applies at once) and its base64 encodings, standard and URL alphabets, at each
// of the three alignments a value can have inside a longer base64 text, cut to the characters
// that depend on the value alone; and the same encodings of each configured credential header's
// rendered value (and of its last word, "user:{value}" after "Basic ") when the format is not
// just {value}. Headers are scrubbed of values of 4 bytes and more, bodies of values of
// minBodySecret bytes and more: shorter strings occur in ordinary text too often to be
// overwritten there.
const (
	minHeaderSecret = 4
	minBodySecret   = 8
	redactionMarker = "[REDACTED-BY-SANDGATE]"
)

// secretSet is the needles of one set of credential values.
type secretSet struct {
	values  []string // sorted: the set's key
	header  []string
	body    [][]byte
	maxBody int // the longest body needle
}

// scrubber builds the needles for the current credential values, rebuilding them only when
// the values change.
type scrubber struct {
	store *credential.Store
	refs  []*config.CredentialRef
	cur   atomic.Pointer[secretSet]
}

func newScrubber(store *credential.Store, cfg config.Proxy) *scrubber {
	s := &scrubber{store: store}
	add := func(r *config.CredentialRef) {
		if r != nil && r.Format != "" && r.Format != "{value}" {
			s.refs = append(s.refs, r)
		}
	}
	for i := range cfg.Routes {
		add(cfg.Routes[i].Credential)
	}
	for i := range cfg.Hosts {
		add(cfg.Hosts[i].Credential)
	}
	return s
}

// current is the needle set of the store's values now.
func (s *scrubber) current() *secretSet {
	vals := s.store.Values()
	slices.Sort(vals)
	if c := s.cur.Load(); c != nil && slices.Equal(c.values, vals) {
		return c
	}
	set := s.build(vals)
	s.cur.Store(set)
	return set
}

func (s *scrubber) build(vals []string) *secretSet {
	set := &secretSet{values: vals}
	seen := map[string]bool{}
	add := func(n string) {
		if n != "" && !seen[n] {
			seen[n] = true
			set.header = append(set.header, n)
			if len(n) >= minBodySecret {
				set.body = append(set.body, []byte(n))
			}
		}
	}
	var encoded []string
	for _, v := range vals {
		if len(v) < minHeaderSecret {
			continue
		}
		add(v)
		if len(v) >= minBodySecret {
			encoded = append(encoded, v)
		}
	}
	for _, r := range s.refs {
		v, ok := s.store.Get(r.Name)
		if !ok || len(v) < minBodySecret {
			continue
		}
		rendered := r.Render(v)
		encoded = append(encoded, rendered)
		if i := strings.LastIndexByte(rendered, ' '); i >= 0 && strings.Contains(rendered[i+1:], v) && rendered[i+1:] != v {
			encoded = append(encoded, rendered[i+1:])
		}
	}
	for _, e := range encoded {
		for _, n := range base64Needles(e) {
			add(n)
		}
	}
	for _, n := range set.body {
		set.maxBody = max(set.maxBody, len(n))
	}
	return set
}

// base64Needles are the base64 texts (standard and URL alphabets) that contain v when v sits at
// each of the three byte offsets within a base64-encoded text: only the characters decided by
// v's bytes alone.
func base64Needles(v string) []string {
	var out []string
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for off := range 3 {
			src := append(make([]byte, off, off+len(v)), v...)
			s := enc.EncodeToString(src)
			skip := []int{0, 2, 3}[off] // characters that hold bits of the offset's bytes
			end := len(src) / 3 * 4     // characters of complete 3-byte groups
			if end-skip >= minBodySecret {
				out = append(out, s[skip:end])
			}
		}
	}
	return out
}

// scrubHeader removes every field of h whose value contains a needle; it reports whether it
// removed any.
func (set *secretSet) scrubHeader(h http.Header) bool {
	removed := false
	for k, vs := range h {
		if set.headerHit(vs) {
			delete(h, k)
			removed = true
		}
	}
	return removed
}

func (set *secretSet) headerHit(vs []string) bool {
	for _, v := range vs {
		for _, n := range set.header {
			if strings.Contains(v, n) {
				return true
			}
		}
	}
	return false
}

// redact overwrites every needle in w with the marker; it reports whether it found one.
func (set *secretSet) redact(w []byte) bool {
	hit := false
	for _, n := range set.body {
		for i := 0; i <= len(w)-len(n); {
			j := bytes.Index(w[i:], n)
			if j < 0 {
				break
			}
			i += j
			for k := range n {
				if k < len(redactionMarker) {
					w[i+k] = redactionMarker[k]
				} else {
					w[i+k] = '*'
				}
			}
			i += len(n)
			hit = true
		}
	}
	return hit
}

// held is the length of the longest suffix of w that begins some needle without completing
// it: the bytes that must wait for the next read.
func (set *secretSet) held(w []byte) int {
	tail := w[len(w)-min(len(w), set.maxBody-1):]
	best := 0
	for _, n := range set.body {
		for i := max(0, len(tail)-(len(n)-1)); i < len(tail); i++ {
			k := bytes.IndexByte(tail[i:], n[0])
			if k < 0 {
				break
			}
			i += k
			if len(tail)-i <= best {
				break
			}
			if bytes.HasPrefix(n, tail[i:]) {
				best = len(tail) - i
				break
			}
		}
	}
	return best
}

// scrubBody is a response body on its way to a sandbox: credential values are overwritten as
// it streams and the trailers are scrubbed once the body has been read.
type scrubBody struct {
	src   io.ReadCloser
	resp  *http.Response // its Trailer is filled in when the body ends
	set   *secretSet
	onHit func()
	carry []byte // at most set.maxBody-1 bytes read but not yet passed on
	ready []byte // scrubbed bytes not yet passed on (reads smaller than two needles)
	buf   []byte
	err   error
}

func (s *scrubBody) Read(p []byte) (int, error) {
	if s.set.maxBody == 0 {
		n, err := s.src.Read(p)
		if err != nil {
			s.scrubTrailer()
		}
		return n, err
	}
	for {
		if len(s.ready) > 0 {
			n := copy(p, s.ready)
			s.ready = s.ready[n:]
			return n, nil
		}
		if s.err != nil {
			return 0, s.err
		}
		if len(p) >= 2*s.set.maxBody {
			w, err := s.fill(p)
			if len(w) > 0 || err != nil {
				return len(w), err
			}
			continue
		}
		if s.buf == nil {
			s.buf = make([]byte, 4*s.set.maxBody)
		}
		s.ready, s.err = s.fill(s.buf)
	}
}

// fill reads into dst after the carried bytes and returns the scrubbed bytes that may go on.
func (s *scrubBody) fill(dst []byte) ([]byte, error) {
	k := copy(dst, s.carry)
	n, err := s.src.Read(dst[k:])
	w := dst[:k+n]
	if s.set.redact(w) {
		s.onHit()
	}
	if err != nil {
		s.carry = nil
		s.scrubTrailer()
		return w, err
	}
	h := s.set.held(w)
	s.carry = append(s.carry[:0], w[len(w)-h:]...)
	return w[:len(w)-h], nil
}

func (s *scrubBody) scrubTrailer() {
	if s.resp != nil && s.set.scrubHeader(s.resp.Trailer) {
		s.onHit()
	}
}

// Close closes the upstream body, which fills in the trailers of a body not read to its end,
// and scrubs them before ReverseProxy copies them.
func (s *scrubBody) Close() error {
	err := s.src.Close()
	s.scrubTrailer()
	return err
}
