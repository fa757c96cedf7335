package proxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/respguard"
)

// A request takes its run's needle set when it leaves (the set in the run's slot, while the
// run's lines are warm): a token minted for the sandbox while the answer is on its way must be
// scrubbed from that answer all the same. The upstream holds the first request until it has
// seen the token of the sandbox's next run (the first run ended meanwhile), then echoes both
// tokens in the first answer's header and body.
func TestATokenMintedWhileAnAnswerIsOnItsWayIsScrubbedFromIt(t *testing.T) {
	store := mintingStore(t)
	up := startHoldingEcho(t)
	h := newHarnessWith(t, func(o *Options) {
		o.UpstreamRoots.AddCert(up.ca.cert)
		o.Credentials = store
	}, func(p *config.Proxy) {
		p.Routes[0].Upstream = "https://api.anthropic.com:" + up.port
	})
	post := func() (int, http.Header, string, error) {
		body := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
		resp, err := h.client(t, "127.0.0.2").Post("http://"+h.addr+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b), err
	}
	type answer struct {
		code int
		h    http.Header
		body string
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		code, hdr, body, err := post()
		first <- answer{code, hdr, body, err}
	}()
	select {
	case <-up.firstArrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the upstream")
	}
	require.Equal(t, 1, store.Forget("agents/alpha-1", "the test ends the run"), "the first run's token")
	code, _, _, err := post() // the sandbox's next run: a new token
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	close(up.release)
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.code, a.body)

	seen := up.seen()
	require.Len(t, seen, 2)
	require.NotEqual(t, seen[0], seen[1], "the second run had a token of its own")
	for i, tok := range seen {
		assert.NotContains(t, a.body, tok, "token %d in the first answer's body", i+1)
		assert.NotContains(t, fmt.Sprint(a.h), tok, "token %d in the first answer's header", i+1)
	}
	assert.Contains(t, a.body, respguard.Marker[:8], "the echo was overwritten in place")
	assert.Empty(t, a.h.Get("X-Echo"), "the header that echoed them was removed")
}

// holdingEcho is a model-API upstream over TLS that holds the first request until release is
// closed, and answers each with every x-api-key it has been sent, in a header and in the text.
type holdingEcho struct {
	ca           *CA
	port         string
	firstArrived chan struct{}
	release      chan struct{}
	mu           sync.Mutex
	keys         []string
}

func startHoldingEcho(t *testing.T) *holdingEcho {
	ca, _ := newTestCA(t)
	e := &holdingEcho{ca: ca, firstArrived: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		e.mu.Lock()
		e.keys = append(e.keys, r.Header.Get("X-Api-Key"))
		n := len(e.keys)
		e.mu.Unlock()
		if n == 1 {
			close(e.firstArrived)
			select {
			case <-e.release:
			case <-r.Context().Done():
				return
			}
		}
		echo := strings.Join(e.seen(), " ")
		w.Header().Set("X-Echo", echo)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",`+
			`"content":[{"type":"text","text":%q}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`, echo)
	}))
	srv.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(hi.ServerName) }}
	srv.StartTLS()
	t.Cleanup(func() {
		select {
		case <-e.release:
		default:
			close(e.release)
		}
		srv.Close()
	})
	_, e.port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return e
}

// seen is every x-api-key the upstream got, in order.
func (e *holdingEcho) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.keys...)
}
