package proxy

import (
	"io"
	"net/http"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/respguard"
)

// Response scrubbing keeps security invariant 1 on every response the proxy relays (base-URL
// routes, intercepted tunnels, plain-HTTP forwards), with the response guard both halves share
// (internal/respguard): no credential value reaches a sandbox in a header, a trailer, a 1xx
// response or the body, whatever the upstream echoes back, in whatever form respguard reads
// (raw, hex, base64 wrapped or not, behind JSON or percent escapes, in pieces across an event
// stream or the strings of a JSON message).
//
//   - Headers, trailers and the headers of forwarded 1xx responses: a field whose value
//     contains a credential is removed.
//   - Bodies are scanned as they stream: a credential is overwritten in place by the marker cut
//     or padded with '*' to its length, so Content-Length stays true; only what could still
//     become a match is held back.
//
// The needles are every credential value of the store (re-read for every response, so a
// rotated value applies at once) and the rendered header value of each configured credential
// whose format is not just {value}.
func newScrubber(store *credential.Store, cfg config.Proxy) *respguard.Source {
	var refs []*config.CredentialRef
	for i := range cfg.Routes {
		refs = append(refs, cfg.Routes[i].Credential)
	}
	for i := range cfg.Hosts {
		refs = append(refs, cfg.Hosts[i].Credential)
	}
	return respguard.NewSource(store, refs...)
}

// scrubBody is a response body on its way to a sandbox: credential values are overwritten as
// it streams and the trailers are scrubbed once the body has been read.
type scrubBody struct {
	*respguard.Reader
	src   io.Closer
	resp  *http.Response // its Trailer is filled in when the body ends
	set   *respguard.Needles
	onHit func()
}

func newScrubBody(resp *http.Response, set *respguard.Needles, onHit func()) *scrubBody {
	return &scrubBody{Reader: respguard.NewReader(resp.Body, set, respguard.InPieces(resp.Header), onHit),
		src: resp.Body, resp: resp, set: set, onHit: onHit}
}

func (s *scrubBody) Read(p []byte) (int, error) {
	n, err := s.Reader.Read(p)
	if err != nil {
		s.scrubTrailer()
	}
	return n, err
}

func (s *scrubBody) scrubTrailer() {
	if s.resp != nil && s.set.ScrubHeader(s.resp.Trailer) {
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
