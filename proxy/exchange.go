package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/proxy/hostport"
)

const routePrefix = "/routes/"

// exchange is one decided request (or one tunnel): the proxy's shape of a call.Call, which
// owns the event, the decision step and the one audit write.
type exchange struct {
	p       *Proxy
	c       *call.Call
	up      *upstream
	dest    hostport.Addr
	cred    string // credential value, never logged or audited
	rawPath string // escaped upstream path below the base path
	body    *call.BoundedBody
	usage   *UsageParser
	charged int64  // tokens of usage already charged to the caller's budget
	spent   string // the limit code that ends a streamed response after its current event
	status  int
	// echoed is set when a credential was removed from the response; truncated when the
	// upstream's response ended before it was complete; tooLarge when its decoding went over
	// its bound (set from the transport's goroutines too: 1xx responses arrive on them).
	echoed, truncated, tooLarge atomic.Bool
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// serve is the proxy's shape of call.Run: act works on the request's exchange (its call begun
// with what the request names) and returns a refusal, which is answered in the shape of the
// exchange's API once the call's event is written; an act that forwards ends the call itself.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, id identity.Identity, kind audit.Kind, act func(context.Context, *exchange) *call.Refusal) {
	x := &exchange{p: p}
	call.Run(r.Context(), p.core, call.Spec{Kind: kind, Identity: id, Target: requestTarget(r)},
		func(ctx context.Context, cl *call.Call) (struct{}, *call.Refusal) {
			x.c = cl
			return struct{}{}, act(ctx, x)
		}, func(rf *call.Refusal) struct{} {
			x.answerRefusal(w, rf)
			return struct{}{}
		})
}

// requestTarget is what a request names before anything of it is checked.
func requestTarget(r *http.Request) audit.Target {
	t := audit.Target{Method: r.Method, Host: r.Host}
	if r.URL != nil && r.Method != http.MethodConnect {
		t.Path = r.URL.Path
	}
	return t
}

// answerRefusal answers the request with rf (the call is already ended by it).
func (x *exchange) answerRefusal(w http.ResponseWriter, rf *call.Refusal) {
	if rf.Close {
		w.Header().Set("Connection", "close")
	}
	writeRefusal(w, rf, x.openAI())
	x.status = rf.Status()
}

// openAI reports whether refusals on this exchange take OpenAI's error shape.
func (x *exchange) openAI() bool { return x.up != nil && x.up.api == config.APIOpenAI }

// refusalBody is the provider-shaped error body of a refusal: Anthropic's
// {"type":"error","error":{"type","message"}} or OpenAI's {"error":{"message","type","code"}},
// with the type from call's one table, so each provider's SDK raises its matching error.
func refusalBody(rf *call.Refusal, openAI bool) []byte {
	msg := "sandgate: " + rf.Reason
	var v any
	if openAI {
		v = map[string]any{"error": map[string]any{"message": msg, "type": rf.ErrorType(true), "code": rf.Code, "param": nil}}
	} else {
		v = map[string]any{"type": "error", "error": map[string]string{"type": rf.ErrorType(false), "message": msg, "code": rf.Code}}
	}
	b, _ := json.Marshal(v)
	return b
}

func writeRefusal(w http.ResponseWriter, rf *call.Refusal, openAI bool) {
	b := refusalBody(rf, openAI)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Proxy-Status", proxyStatus(rf))
	rf.SetHeaders(h)
	w.WriteHeader(rf.Status())
	_, _ = w.Write(b)
}

// finish ends the exchange's call: the status the sandbox got, tokens from the usage parser.
func (x *exchange) finish() {
	if x.usage != nil {
		u := x.usage.Usage()
		x.c.SetUsage(u.In, u.Out)
		x.chargeTokens()
	}
	if x.echoed.Load() {
		x.c.CredentialEchoed()
	}
	if x.truncated.Load() {
		rf := call.Refuse(call.CodeUpstreamTruncated, "the upstream's response ended before it was complete")
		if x.tooLarge.Load() {
			rf = call.Refuse(call.CodeUpstreamTooLarge, "the upstream's response decoded past its bound")
		}
		x.c.Fail(rf)
		return
	}
	x.c.Answered(x.status)
	x.c.Finish()
}

// credentialEchoed records that a credential was removed from what the sandbox gets: once per
// exchange in the event and the metric.
func (x *exchange) credentialEchoed() {
	if !x.echoed.Swap(true) {
		t := x.c.Target()
		x.p.m.credentialEcho(t.Route, t.Host)
	}
}

// serveRoute handles /routes/NAME/rest.
func (p *Proxy) serveRoute(w http.ResponseWriter, r *http.Request, id identity.Identity) {
	p.serve(w, r, id, audit.KindHTTPRequest, func(ctx context.Context, x *exchange) *call.Refusal {
		rest := strings.TrimPrefix(r.URL.EscapedPath(), routePrefix)
		name, rest, _ := strings.Cut(rest, "/")
		rest = "/" + rest
		x.c.Describe(audit.Target{Route: name})
		up := p.routes[name]
		if up == nil {
			return call.Refuse(call.CodeNoRoute, "no route named %q", name)
		}
		x.up, x.dest = up, up.addr
		if hasDotSegment(rest) {
			return call.Refuse(call.CodeBadPath, "path contains dot segments")
		}
		x.c.Describe(audit.Target{Host: auditHost(up.addr, up.scheme)})
		return p.decideAndForward(ctx, w, r, x, rest)
	})
}

// serveForward handles a plain-HTTP absolute-URI request (GET http://host/path).
func (p *Proxy) serveForward(w http.ResponseWriter, r *http.Request, id identity.Identity) {
	p.serve(w, r, id, audit.KindHTTPRequest, func(ctx context.Context, x *exchange) *call.Refusal {
		if r.URL.Scheme != "http" {
			return call.Refuse(call.CodeBadScheme, "only http:// absolute URIs are forwarded; use CONNECT for https")
		}
		dest, err := hostport.Parse(r.URL.Host, 80)
		if err != nil {
			return call.Refuse(call.CodeBadHost, "%v", err)
		}
		x.up, x.dest = p.plain, dest
		x.c.Describe(audit.Target{Host: auditHost(dest, "http")})
		return p.decideAndForward(ctx, w, r, x, r.URL.EscapedPath())
	})
}

func hasDotSegment(p string) bool {
	lp := strings.ToLower(p)
	for _, seg := range strings.Split(strings.ReplaceAll(lp, "%2f", "/"), "/") {
		s := strings.ReplaceAll(seg, "%2e", ".")
		if s == "." || s == ".." {
			return true
		}
	}
	return false
}

func auditHost(a hostport.Addr, scheme string) string {
	if a.Port == defaultPort(scheme) {
		return a.Host
	}
	return a.String()
}

// decideAndForward is the act of a request the proxy forwards: the policy input (with the
// model request read from the body), call.Authorize, the credential, forward, and the end of
// the exchange's call; or the refusal serve answers. x.up and x.dest are set; path is the
// escaped upstream path (before the base path).
func (p *Proxy) decideAndForward(ctx context.Context, w http.ResponseWriter, r *http.Request, x *exchange, path string) *call.Refusal {
	unescaped, err := url.PathUnescape(path)
	if err != nil {
		return call.Refuse(call.CodeBadPath, "path does not unescape")
	}
	in := &policy.Input{Kind: audit.KindHTTPRequest, Identity: x.c.Identity(), HTTP: &policy.HTTP{
		Method: r.Method, Host: x.dest.Host, Port: x.dest.Port, Path: unescaped, Route: x.up.route, MaxTokens: -1}}
	x.c.Describe(audit.Target{Path: unescaped})
	x.rawPath = path
	if !in.Identity.Known {
		// Identity first, as ServeHTTP does for a new request: a caller that stopped being a
		// sandbox mid-tunnel (its pod deleted) gets the same answer, its body never read.
		return call.Refuse(call.CodeUnknownCaller, "caller is not a known sandbox")
	}
	l := p.cfg.Limits
	x.body = call.BoundBody(w, r, call.BodyTiming{Timeout: l.BodyTimeout.D(), MinRate: l.MinBodyRate})
	body, rf := p.readModelRequest(r, x, in)
	if rf != nil {
		return rf
	}
	d, rf := x.c.Authorize(ctx, in, true)
	if rf == nil {
		rf = p.chooseCredential(x, d)
	}
	if rf != nil {
		return rf
	}
	r2 := r.WithContext(context.WithValue(ctx, exchangeKey{}, x))
	if body != nil {
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		x.c.BytesIn.Store(int64(len(body)))
	} else if r.Body != nil && r.Body != http.NoBody {
		r2.Body = &countingReader{ReadCloser: r.Body, n: &x.c.BytesIn}
	}
	sw := &statusWriter{ResponseWriter: w, x: x}
	defer func() { // also when ReverseProxy aborts the handler mid-body
		x.status = sw.status
		x.finish()
	}()
	p.rp.ServeHTTP(sw, r2)
	return nil
}

// readModelRequest reads the body of a request to a model API and puts its model, max_tokens
// and stream into in. It returns the body to forward (nil when it was not read).
func (p *Proxy) readModelRequest(r *http.Request, x *exchange, in *policy.Input) ([]byte, *call.Refusal) {
	if x.up.api == config.APINone || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	limit := p.cfg.Limits.BodyBytes
	body, err := readBody(r.Body, r.ContentLength, limit)
	if x.body.Cut() {
		rf := call.Refuse(call.CodeBodyTimeout, "request body not received in time")
		rf.Close = true
		return nil, rf
	}
	if err != nil {
		return nil, call.Refuse(call.CodeBodyReadFailed, "reading the request body failed")
	}
	if int64(len(body)) > limit {
		rf := call.Refuse(call.CodeBodyTooLarge, "model request body exceeds %d bytes; the model cannot be checked", limit)
		rf.Close = true
		return nil, rf
	}
	if len(body) > 0 {
		mr, err := ParseModelRequest(body)
		if err != nil {
			return nil, call.Refuse(call.CodeBadModelRequest, "%v", err)
		}
		in.HTTP.Model, in.HTTP.MaxTokens, in.HTTP.Stream = mr.Model, mr.MaxTokens, mr.Stream
		x.c.Describe(audit.Target{Model: mr.Model})
	}
	return body, nil
}

// chooseCredential checks the credential policy chose against the destination's and takes its
// value: only the destination's configured credential can ever be injected.
// The step is the gateway's too (call.TakeCredential).
func (p *Proxy) chooseCredential(x *exchange, d policy.Decision) *call.Refusal {
	configured := ""
	if x.up.cred != nil {
		configured = x.up.cred.Name
	}
	var rf *call.Refusal
	x.cred, rf = x.c.TakeCredential(p.opts.Credentials, configured, d.Credential)
	return rf
}

// stripRequestHeaders are removed from every forwarded request (hop-by-hop headers are removed
// by httputil.ReverseProxy, which also drops Forwarded and X-Forwarded-{For,Host,Proto}).
var stripRequestHeaders = []string{"Authorization", "X-Api-Key", "Proxy-Authorization", "Proxy-Connection",
	"Forwarded", "X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Via", "Cf-Connecting-Ip"}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	x := exchangeFrom(pr.In.Context())
	out := pr.Out
	host := x.dest.String()
	if x.dest.Port == defaultPort(x.up.scheme) {
		host = x.dest.Host
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
	}
	u, err := url.Parse(x.up.scheme + "://" + host + x.up.basePath + x.rawPath)
	if err != nil { // cannot happen: the path came from a parsed request
		u = &url.URL{Scheme: x.up.scheme, Host: host, Path: x.up.basePath + x.c.Target().Path}
	}
	u.RawQuery = pr.In.URL.RawQuery
	out.URL = u
	out.Host = ""
	for _, h := range stripRequestHeaders {
		out.Header.Del(h)
	}
	for k := range out.Header {
		// Header names are ASCII tokens (httpconn refuses others): folded without a copy each.
		if len(k) >= len("x-forwarded-") && strings.EqualFold(k[:len("x-forwarded-")], "x-forwarded-") {
			delete(out.Header, k)
		}
	}
	if x.reads() {
		// Usage is read from the body, and an echoed credential can only be found in a body
		// that is not compressed: the transport then asks for gzip itself and decompresses, and
		// modifyResponse decodes whatever else the upstream sends (or refuses it).
		out.Header.Del("Accept-Encoding")
	}
	if x.up.cred != nil {
		// No piece of a response to a credentialed request: a sandbox asking for many small
		// ranges of an echo could assemble a credential from pieces no scan can see whole.
		out.Header.Del("Range")
		out.Header.Del("If-Range")
	}
	if span := x.c.Span(); span.SpanContext().IsValid() {
		propagation.TraceContext{}.Inject(trace.ContextWithSpan(pr.Out.Context(), span), propagation.HeaderCarrier(out.Header))
	}
	if c := x.up.cred; c != nil {
		credential.Inject(out.Header, c, x.cred)
	}
}

// reads reports whether Sandgate reads the exchange's response bodies: a model API's (usage)
// and any that answers an injected credential (scrubbing). Their content codings are decoded
// or the response refused.
func (x *exchange) reads() bool { return x.up.api != config.APINone || x.up.cred != nil }

// needles are what the answer to x's sandbox is scrubbed of: the static credentials and its
// run's minted tokens (respguard.Source.For).
func (x *exchange) needles() *respguard.Needles {
	id := x.c.Identity()
	return x.p.scrub.For(id.Namespace, id.Sandbox)
}

// errPartial refuses a partial response to a credentialed request (upstream_partial).
var errPartial = errors.New("partial response to a request that carried a credential")

func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeFrom(resp.Request.Context())
	set := x.needles()
	if set.ScrubHeader(resp.Header) {
		x.credentialEchoed()
	}
	if x.up.cred != nil && (resp.StatusCode == http.StatusPartialContent || resp.Header.Get("Content-Range") != "") {
		return errPartial
	}
	if x.reads() {
		if err := respguard.Decode(resp); err != nil {
			return err
		}
	}
	if x.up.api != config.APINone {
		x.usage = NewUsageParser(resp.Header.Get("Content-Type"))
	}
	end := newStreamEnd(resp.Header.Get("Content-Type"), x.up.api)
	end.follow(x.usage)
	if end != nil || resp.Uncompressed {
		// A stream goes to the sandbox chunked, so that a cut one ends without the terminator
		// instead of as a complete body of the declared length; so does a decoded body.
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	resp.Body = &countingBody{ReadCloser: newScrubBody(resp, set, x.credentialEchoed), x: x, ctx: resp.Request.Context(), end: end}
	return nil
}

// upstreamError answers a request whose upstream could not be reached or failed. A
// destination the dial guard refuses is a denial (403, the guard's reason); a name that does
// not resolve or a failed dial is the upstream's failure (502, 504 on a timeout), not a
// decision.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	rf := upstreamRefusal(err)
	if x.body.Cut() {
		rf = call.Refuse(call.CodeBodyTimeout, "request body not received in time")
	}
	writeRefusal(w, rf, x.openAI())
	if rf.Class() == call.ClassPolicy {
		x.status = x.c.Refuse(rf)
		return
	}
	x.status = x.c.Fail(rf)
}

// upstreamRefusal classifies an upstream error: a dial-guard denial keeps the guard's reason
// code; resolution failures, dial failures and timeouts are upstream errors with the cause. A
// name that does not resolve or a dial that fails is "upstream unreachable (resolve NAME: …)" or
// "(dial HOST:PORT: …)", never a denial: no policy was involved.
func upstreamRefusal(err error) *call.Refusal {
	var de *DialError
	if errors.As(err, &de) {
		switch de.Reason {
		case "":
			// Nothing answered (refused, unreachable): unavailable, 503, as the gateway answers
			// a call to an upstream that is down; 502 is kept for an upstream that answered badly.
			code := call.CodeUpstreamUnavailable
			if errors.Is(err, context.DeadlineExceeded) {
				code = call.CodeUpstreamTimeout
			}
			return call.Refuse(code, "upstream unreachable (%v)", de)
		case DenyResolve, DenyNoAddress:
			return call.Refuse(string(de.Reason), "upstream unreachable (%v)", de)
		}
		return call.Refuse(string(de.Reason), "destination denied by dial guard: %s", de.Reason)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return call.Refuse(call.CodeUpstreamTimeout, "upstream did not answer in time")
	case errors.Is(err, respguard.ErrEncoding):
		return call.Refuse(call.CodeUpstreamEncoding, "%v", err)
	case errors.Is(err, errPartial):
		return call.Refuse(call.CodeUpstreamPartial, "the upstream answered with part of a response, which is not passed on where a credential was sent")
	}
	return call.Refuse(call.CodeUpstreamError, "upstream unavailable: %v", err)
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.ReadCloser.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// countingBody counts the response bytes and feeds them to the usage parser as they pass. A
// streamed (SSE) model response is charged to the caller's token budget event by event as usage
// appears in it; once the budget is spent the body ends (io.EOF) at the end of that event.
//
// It also watches how the upstream's body ends: a read error or an SSE stream cut before its
// end marks the exchange truncated (upstreamEnd).
type countingBody struct {
	io.ReadCloser
	x     *exchange
	ctx   context.Context // the sandbox's request
	end   *streamEnd      // nil unless SSE
	ended bool
}

func (c *countingBody) Read(b []byte) (int, error) {
	if c.ended {
		return 0, io.EOF
	}
	n, err := c.ReadCloser.Read(b)
	if n > 0 && c.x.usage != nil {
		if c.x.usage.sse && c.x.p.core.Admission() != nil {
			n = c.feedSSE(b[:n])
		} else {
			_, _ = c.x.usage.Write(b[:n])
		}
	}
	c.x.c.BytesOut.Add(int64(n))
	if c.ended {
		return n, io.EOF
	}
	if c.end != nil && n > 0 {
		c.end.feed(b[:n])
	}
	if err != nil {
		err = c.upstreamEnd(err)
	}
	return n, err
}

// feedSSE feeds p to the usage parser, charging new usage after each event, and returns how
// much of p to pass on: all of it, or up to the end of the event in which the budget was found
// spent.
func (c *countingBody) feedSSE(p []byte) int {
	off := 0
	for off < len(p) {
		n, event := c.x.usage.feedEvent(p[off:])
		off += n
		if !event {
			return len(p)
		}
		c.x.chargeTokens()
		if c.x.spent != "" {
			c.ended = true
			c.x.c.Note(c.x.spent)
			return off
		}
	}
	return len(p)
}

// chargeTokens charges the usage reported since the last charge to the caller's token budget and
// remembers when the budget is spent.
func (x *exchange) chargeTokens() {
	u := x.usage.Usage()
	total := u.In + u.Out
	if total <= x.charged {
		return
	}
	v := x.p.core.Admission().AddTokens(x.c.Detached(), x.c.Identity(), total-x.charged)
	x.charged = total
	if !v.Allowed && x.spent == "" {
		x.spent = string(v.Code)
	}
}

// statusWriter remembers the status and scrubs the headers of 1xx responses, which
// ReverseProxy writes from the transport's Got1xxResponse hook; Unwrap keeps flushing (SSE)
// working.
type statusWriter struct {
	http.ResponseWriter
	x      *exchange
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if code < 200 && s.x.needles().ScrubHeader(s.ResponseWriter.Header()) {
		s.x.credentialEchoed()
	}
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// readBody reads a request body of up to limit bytes, and one more when there is more. A body
// that says its length starts in a buffer of that size, up to maxBodyPrealloc: a client that
// declares a large body and sends it slowly holds no more memory than it has sent, plus that.
func readBody(body io.Reader, length, limit int64) ([]byte, error) {
	size := int64(512)
	if length >= 0 && length <= limit {
		size = min(length, maxBodyPrealloc) + 1 // +1: room to read the end without growing
	}
	buf := make([]byte, 0, size)
	r := io.LimitReader(body, limit+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

const maxBodyPrealloc = 256 << 10
