package bench

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/internal/sse/ssetest"
	"github.com/sandgate/sandgate/proxy"
)

// upstreamIP is the loopback address every stand-in listens on; sandboxes use 127.10.x.y.
const upstreamIP = "127.0.0.50"

// modelHost is the fake public name of the model-API stand-in (Sandgate resolves it through
// proxy.resolve_overrides; the loadgen's direct client dials upstreamIP with this SNI).
const modelHost = "api.model.test"

// Upstreams are the fast local servers behind every proxy: a TLS model-API stand-in (JSON and
// SSE Messages responses), the same handler over plain HTTP (for plain forwarding), and a
// stateful Streamable HTTP MCP server. They count connections and TLS handshakes.
type Upstreams struct {
	TLSAddr  string // 127.0.0.50:port, TLS (h2 and http/1.1)
	HTTPAddr string // 127.0.0.50:port, plain HTTP
	MCPURL   string // http://127.0.0.50:port/mcp
	CA       *proxy.CA
	CAPath   string

	model conns // TLS model API only: what "upstream connections" means in the report
	srvs  []*http.Server

	// Set when the stand-ins run in a process of their own (startUpstreamsProcess): their
	// counters are read from its control address.
	control string
	caPEM   []byte
	proc    *process
}

// conns counts the connections of one listener.
type conns struct {
	opened     atomic.Int64
	open       atomic.Int64
	peak       atomic.Int64
	handshakes atomic.Int64
}

func (c *conns) state(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		c.opened.Add(1)
		n := c.open.Add(1)
		for {
			p := c.peak.Load()
			if n <= p || c.peak.CompareAndSwap(p, n) {
				break
			}
		}
	case http.StateClosed, http.StateHijacked:
		c.open.Add(-1)
	}
}

// UpstreamCounts is a snapshot of the model-API stand-in's counters.
type UpstreamCounts struct {
	Opened, Peak, Handshakes int64
}

// ModelCounts returns the counters and resets the peak to the connections open now.
func (u *Upstreams) ModelCounts() UpstreamCounts {
	if u.control != "" {
		return u.remoteCounts()
	}
	c := UpstreamCounts{Opened: u.model.opened.Load(), Peak: u.model.peak.Load(), Handshakes: u.model.handshakes.Load()}
	u.model.peak.Store(u.model.open.Load())
	return c
}

// remoteCounts asks the stand-ins' process for ModelCounts (zero counts if it cannot answer).
func (u *Upstreams) remoteCounts() UpstreamCounts {
	var c UpstreamCounts
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + u.control + "/counts")
	if err != nil {
		return c
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&c)
	return c
}

// CACertPEM is the stand-ins' CA certificate, which the sandboxes' clients trust.
func (u *Upstreams) CACertPEM() []byte {
	if u.caPEM != nil {
		return u.caPEM
	}
	return u.CA.CertPEM()
}

// Stop stops the stand-ins' process, if they run in one (in process they stop with ctx).
func (u *Upstreams) Stop() {
	if u.proc != nil {
		u.proc.Stop(2 * time.Second)
	}
}

// upstreamsInfo is what a stand-ins process reports, in DIR/upstreams.json, once it listens.
type upstreamsInfo struct {
	TLSAddr, HTTPAddr, MCPURL, CAPath, Control string
}

const upstreamsInfoFile = "upstreams.json"

// ServeUpstreams runs the stand-ins (StartUpstreams, with the CA in dir) and a control listener
// that serves their counters, writes dir/upstreams.json, and serves until ctx ends. It is the
// body of `sandbench -serve-upstreams DIR`: in a process of their own the stand-ins' end of
// every connection does not count against the loadgen's open-file limit (a 10,000-sandbox
// direct cell holds both ends otherwise).
func ServeUpstreams(ctx context.Context, dir string) error {
	u, err := StartUpstreams(ctx, dir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", upstreamIP+":0")
	if err != nil {
		return fmt.Errorf("listen control: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(u.ModelCounts())
	})}
	go serveQuiet(func() error { return srv.Serve(ln) })
	defer srv.Close()
	b, err := json.Marshal(upstreamsInfo{TLSAddr: u.TLSAddr, HTTPAddr: u.HTTPAddr, MCPURL: u.MCPURL,
		CAPath: u.CAPath, Control: ln.Addr().String()})
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, upstreamsInfoFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, upstreamsInfoFile)); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// startUpstreamsProcess runs `exe -serve-upstreams dir` and waits for it to listen.
func startUpstreamsProcess(ctx context.Context, exe, dir string) (*Upstreams, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("upstreams dir: %w", err)
	}
	p, err := startProcess("upstreams", dir, nil, exe, "-serve-upstreams", dir)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, upstreamsInfoFile))
		if err == nil {
			var info upstreamsInfo
			if err := json.Unmarshal(b, &info); err != nil {
				p.Stop(time.Second)
				return nil, fmt.Errorf("upstreams process: %s: %w", upstreamsInfoFile, err)
			}
			pem, err := os.ReadFile(info.CAPath)
			if err != nil {
				p.Stop(time.Second)
				return nil, fmt.Errorf("upstreams process: %w", err)
			}
			return &Upstreams{TLSAddr: info.TLSAddr, HTTPAddr: info.HTTPAddr, MCPURL: info.MCPURL,
				CAPath: info.CAPath, control: info.Control, caPEM: pem, proc: p}, nil
		}
		if err := p.exited(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.Stop(time.Second)
			return nil, fmt.Errorf("upstreams process did not start within 15s (log: %s)", p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartUpstreams starts the stand-ins with a fresh CA written to dir. They stop when ctx ends.
func StartUpstreams(ctx context.Context, dir string) (*Upstreams, error) {
	certPath, keyPath, err := proxy.InitCA(dir, true, time.Now())
	if err != nil {
		return nil, fmt.Errorf("stand-in CA: %w", err)
	}
	ca, err := proxy.LoadCA(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("stand-in CA: %w", err)
	}
	u := &Upstreams{CA: ca, CAPath: certPath}
	quiet := log.New(io.Discard, "", 0)
	tlsLn, err := net.Listen("tcp", upstreamIP+":0")
	if err != nil {
		return nil, fmt.Errorf("listen model API: %w", err)
	}
	u.TLSAddr = tlsLn.Addr().String()
	tlsSrv := &http.Server{Handler: http.HandlerFunc(serveModelAPI), ErrorLog: quiet, ConnState: u.model.state,
		TLSConfig: &tls.Config{
			NextProtos: []string{"h2", "http/1.1"},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				u.model.handshakes.Add(1)
				return nil, nil
			},
			GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
				name := h.ServerName
				if name == "" {
					name = upstreamIP // a client that dialed the IP literal sends no SNI
				}
				return ca.Leaf(name)
			},
		}}
	httpLn, err := net.Listen("tcp", upstreamIP+":0")
	if err != nil {
		return nil, fmt.Errorf("listen plain HTTP: %w", err)
	}
	u.HTTPAddr = httpLn.Addr().String()
	httpMux := http.NewServeMux()
	httpMux.HandleFunc("POST "+tokenPath, serveToken)
	httpMux.HandleFunc("/", serveModelAPI)
	httpSrv := &http.Server{Handler: httpMux, ErrorLog: quiet}
	mcpLn, err := net.Listen("tcp", upstreamIP+":0")
	if err != nil {
		return nil, fmt.Errorf("listen MCP: %w", err)
	}
	u.MCPURL = "http://" + mcpLn.Addr().String() + "/mcp"
	mcpSrv := &http.Server{Handler: server.NewStreamableHTTPServer(newMCPServer(), server.WithStateful(true)), ErrorLog: quiet}
	u.srvs = []*http.Server{tlsSrv, httpSrv, mcpSrv}
	go serveQuiet(func() error { return tlsSrv.ServeTLS(tlsLn, "", "") })
	go serveQuiet(func() error { return httpSrv.Serve(httpLn) })
	go serveQuiet(func() error { return mcpSrv.Serve(mcpLn) })
	go func() {
		<-ctx.Done()
		for _, s := range u.srvs {
			_ = s.Close()
		}
	}()
	return u, nil
}

func serveQuiet(f func() error) {
	if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Printf("bench upstream: %v", err)
	}
}

func newMCPServer() *server.MCPServer {
	s := server.NewMCPServer("bench-upstream", "1", server.WithToolCapabilities(true))
	s.AddTool(mcp.NewTool("echo", mcp.WithString("message", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("message", "")), nil
		})
	return s
}

// serveModelAPI speaks enough of the Anthropic Messages API: POST /v1/messages answers JSON or,
// with "stream": true, SSE (flushed per event); anything else gets a small JSON list.
// tokenPath is the stand-ins' OAuth 2.0 token endpoint on the plain-HTTP listener: a new
// access token for every request, living an hour (the "minted" target's provider).
const tokenPath = "/oauth2/token"

// serveToken answers as Ory Hydra (the tests' IdP) does: "ory_at_", 32 random bytes and a
// 32-byte signature, each in unpadded base64url. The form matters to the figure: the guard
// holds a streamed answer back while one of its JSON values ends in four or more leading bytes
// of a credential (respguard.pieceHold), and an earlier form, "bench-minted-" and hex, began
// with the word the stand-in's model name ends in ("claude-bench"): every streamed answer was
// held to its end and scanned again at each read, which measured the two names' collision
// rather than the minted credential (route CPU 1.06×; BenchmarkReader/minted/short 2.4×).
func serveToken(w http.ResponseWriter, _ *http.Request) {
	b := make([]byte, 64)
	_, _ = rand.Read(b)
	enc := base64.RawURLEncoding
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"access_token":"ory_at_%s.%s","token_type":"bearer","expires_in":3600}`,
		enc.EncodeToString(b[:32]), enc.EncodeToString(b[32:]))
}

func serveModelAPI(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[{"id":"claude-bench","type":"model"}]}`)
		return
	}
	// The stand-in reads the body as a model API would, quickly: a conversation-sized body must
	// not make the upstream the bottleneck of the cell.
	body, _ := io.ReadAll(r.Body)
	req, err := proxy.ParseModelRequest(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hello from the bench"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":34}}`, req.Model)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f, _ := w.(http.Flusher)
	for _, e := range ssetest.ModelAnswer(req.Model) {
		_, _ = io.WriteString(w, e)
		if f != nil {
			f.Flush()
		}
	}
}
