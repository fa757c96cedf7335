// Command relay is the bench's bare Go proxy: the floor any Go proxy can reach.
//
// On -listen it answers "CONNECT host:port", dials that address, and copies bytes both ways.
// With -route-listen it also serves a base-URL route the way the simplest Go reverse proxy
// would: httputil.ReverseProxy over one pooled HTTP/2 transport to -route-upstream, the path
// prefix /routes/NAME stripped and one API-key header set. No policy, no identity, no audit,
// no body parsing, no DNS beyond what net.Dial does. With -mitm-listen it is goproxy's own TLS
// interception with nothing added (the floor of the intercept workload): every CONNECT is
// intercepted with leaves signed by -mitm-ca-cert/-mitm-ca-key (cached per host), and the
// requests inside go upstream over the route's pooled transport. It stops on SIGINT or
// SIGTERM. With -mcp-listen it is the bare MCP gateway mcp-go allows: a Streamable HTTP server
// offering the tools of -mcp-upstream, each call forwarded over one shared mcp-go client
// session, with no policy, identity, limits or audit (the floor of the mcp workload).
//
//	relay -listen 127.0.0.1:3130 [-route-listen 127.0.0.1:3131 -route-upstream https://host:port
//	      -route-ca ca.pem -route-dial 127.0.0.50:port]
//	relay -listen "" -mitm-listen 127.0.0.1:3132 -mitm-ca-cert ca.crt -mitm-ca-key ca.key
//	      -route-ca ca.pem -route-dial 127.0.0.50:port
//	relay -listen "" -mcp-listen 127.0.0.1:3133 -mcp-upstream http://127.0.0.50:port/mcp
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:3130", "CONNECT listen address (off when empty)")
	routeListen := flag.String("route-listen", "", "base-URL route listen address (off when empty)")
	routeUpstream := flag.String("route-upstream", "", "the route's upstream base URL (https://host:port)")
	routeCA := flag.String("route-ca", "", "PEM file of the CA that signed the route upstream's certificate")
	routeDial := flag.String("route-dial", "", "address to dial for the route upstream instead of resolving its host")
	mitmListen := flag.String("mitm-listen", "", "goproxy interception listen address (off when empty)")
	mitmCert := flag.String("mitm-ca-cert", "", "PEM certificate of the CA that signs intercepted hosts")
	mitmKey := flag.String("mitm-ca-key", "", "PEM key of that CA")
	mcpListen := flag.String("mcp-listen", "", "bare MCP gateway listen address (off when empty)")
	mcpUpstream := flag.String("mcp-upstream", "", "the MCP server behind it (Streamable HTTP URL)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
	serve := func(name string, srv *http.Server) {
		go func() { <-ctx.Done(); _ = srv.Close() }()
		go func() {
			if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
				fail(fmt.Errorf("%s: %w", name, err))
			}
		}()
	}
	if *routeListen != "" || *mitmListen != "" {
		tr, err := upstreamTransport(*routeCA, *routeDial)
		if err != nil {
			fail(err)
		}
		if *routeListen != "" {
			srv, err := routeServer(*routeListen, *routeUpstream, tr)
			if err != nil {
				fail(err)
			}
			serve("route", srv)
		}
		if *mitmListen != "" {
			srv, err := mitmServer(*mitmListen, *mitmCert, *mitmKey, tr)
			if err != nil {
				fail(err)
			}
			serve("mitm", srv)
		}
	}
	if *mcpListen != "" {
		srv, err := mcpServer(ctx, *mcpListen, *mcpUpstream)
		if err != nil {
			fail(err)
		}
		serve("mcp", srv)
	}
	if *listen == "" {
		<-ctx.Done()
		return
	}
	if err := run(ctx, *listen); err != nil {
		fail(err)
	}
}

// apiKey is injected into every routed request, as Sandgate injects the real key.
const apiKey = "sk-bench-not-a-real-key-0123456789"

// upstreamTransport is the pooled HTTP/2 transport to the model-API stand-in: its CA trusted,
// every dial sent to dial when set.
func upstreamTransport(caFile, dial string) (*http.Transport, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("-route-ca: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-route-ca %s holds no certificate", caFile)
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			if dial != "" {
				a = dial
			}
			return d.DialContext(ctx, network, a)
		},
		TLSClientConfig:     &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     time.Minute,
	}, nil
}

// routeServer is the bare reverse proxy of the route workload.
func routeServer(addr, upstream string, tr *http.Transport) (*http.Server, error) {
	target, err := url.Parse(upstream)
	if err != nil || target.Host == "" {
		return nil, fmt.Errorf("-route-upstream %q is not a URL", upstream)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			path := strings.TrimPrefix(pr.In.URL.Path, "/routes/")
			if i := strings.IndexByte(path, '/'); i >= 0 {
				path = path[i:]
			}
			pr.SetURL(target)
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Header.Set("X-Api-Key", apiKey)
		},
		Transport:  tr,
		BufferPool: &buffers{},
		ErrorLog:   log.New(io.Discard, "", 0),
	}
	return &http.Server{Addr: addr, Handler: rp, ReadHeaderTimeout: 10 * time.Second}, nil
}

// mitmServer is goproxy intercepting every CONNECT, as its README shows, with a certificate
// cache (goproxy's advice for production) and the pooled upstream transport.
func mitmServer(addr, certFile, keyFile string, tr *http.Transport) (*http.Server, error) {
	ca, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("-mitm-ca-cert/-mitm-ca-key: %w", err)
	}
	if ca.Leaf, err = x509.ParseCertificate(ca.Certificate[0]); err != nil {
		return nil, fmt.Errorf("-mitm-ca-cert: %w", err)
	}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0)
	gp.Tr = tr
	gp.CertStore = &certCache{m: map[string]*tls.Certificate{}}
	mitm := &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: goproxy.TLSConfigFromCA(&ca)}
	gp.OnRequest().HandleConnectFunc(func(host string, _ *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		return mitm, host
	})
	return &http.Server{Addr: addr, Handler: gp, ReadHeaderTimeout: 10 * time.Second}, nil
}

// mcpServer connects to upstream, lists its tools and serves them, every call forwarded on
// the one client session, the way the mcp-go README composes a server and a client.
func mcpServer(ctx context.Context, addr, upstream string) (*http.Server, error) {
	// Pooled like Sandgate's upstream client (http.DefaultTransport keeps 2 idle connections).
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}}
	tr, err := transport.NewStreamableHTTP(upstream, transport.WithHTTPBasicClient(hc))
	if err != nil {
		return nil, fmt.Errorf("-mcp-upstream: %w", err)
	}
	c := client.NewClient(tr)
	if err := c.Start(ctx); err != nil {
		return nil, fmt.Errorf("-mcp-upstream: %w", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "bench-relay", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		return nil, fmt.Errorf("-mcp-upstream: initialize: %w", err)
	}
	tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		return nil, fmt.Errorf("-mcp-upstream: tools/list: %w", err)
	}
	s := server.NewMCPServer("bench-relay", "1", server.WithToolCapabilities(false))
	for _, t := range tools.Tools {
		s.AddTool(t, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return c.CallTool(ctx, req)
		})
	}
	return &http.Server{Addr: addr, Handler: server.NewStreamableHTTPServer(s, server.WithStateful(true)),
		ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}, nil
}

// certCache is a goproxy.CertStorage: one leaf per host.
type certCache struct {
	mu sync.Mutex
	m  map[string]*tls.Certificate
}

func (c *certCache) Fetch(host string, gen func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cert, ok := c.m[host]; ok {
		return cert, nil
	}
	cert, err := gen()
	if err == nil {
		c.m[host] = cert
	}
	return cert, err
}

// buffers recycles the copy buffers, as Sandgate does.
type buffers struct{ p sync.Pool }

func (b *buffers) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *buffers) Put(buf []byte) { b.p.Put(&buf) }

func run(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	go func() { <-ctx.Done(); _ = ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); serve(c) }()
	}
}

// serve handles one client connection: one CONNECT, then a relay until either side closes.
func serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 4096)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n")
		return
	}
	up, err := net.DialTimeout("tcp", req.Host, 10*time.Second)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
		return
	}
	defer up.Close()
	_ = c.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		// Bytes the client sent after the CONNECT head are still buffered in br.
		_, _ = io.Copy(up, br)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		close(done)
	}()
	_, _ = io.Copy(c, up)
	_ = c.Close()
	<-done
}
