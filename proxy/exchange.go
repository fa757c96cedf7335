package proxy

import (
	"bytes"
	"context"
	"encoding/json"
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
	p *Proxy
	c *call.Call
	// set is the needle set of the run whose minted token the request carries, taken when the
	// request left (while the run's lines were warm from the take), and valid while the
	// credential store's generation is setGen (needles).
	set     *respguard.Needles
	setGen  uint64
	up      *upstream
	dest    hostport.Addr
	cred    string // credential value, never logged or audited
	read    []byte // the request body askForward read (a model request), nil when not read
	rawPath string // escaped upstream path below the base path
	body    *call.BoundedBody
	usage   *UsageParser
	charged int64  // tokens of usage already charged to the caller's budget
	spent   string // the limit code that ends a streamed response after its current event
	status  int
	// ended is how the forward ended when not as the response says (an error the proxy's error
	// handler answered); aborted is the panic that abandoned the response (re-raised once the
	// call has ended, for the connection server to cut it).
	ended   *call.End
	aborted any
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

// serve is the proxy's shape of call.Run: ask reads the request on its exchange (its call begun
// with what the request names) and returns the question for policy, or a refusal, which is
// answered in the shape of the exchange's API once the call's event is written; an allowed
// request is forwarded (forward).
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, id identity.Identity, kind audit.Kind, ask func(context.Context, *exchange) (call.Question, *call.Refusal)) {
	x := &exchange{p: p}
	call.Run(r.Context(), p.core, call.Spec{Kind: kind, Identity: id, Target: requestTarget(r)}, call.Steps[struct{}]{
		Ask: func(ctx context.Context, cl *call.Call) (call.Question, *call.Refusal) {
			x.c = cl
			return ask(ctx, x)
		},
		Act: func(ctx context.Context, _ *call.Call, g call.Grant) (struct{}, call.End) {
			return struct{}{}, p.forward(ctx, w, r, x, g)
		},
		Refused: func(rf *call.Refusal) struct{} {
			x.answerRefusal(w, rf)
			return struct{}{}
		},
	})
	if x.aborted != nil {
		panic(x.aborted) // the response was abandoned (http.ErrAbortHandler): its call has ended
	}
}

// refusing is the ask of a request refused whatever it asks.
func refusing(rf *call.Refusal) func(context.Context, *exchange) (call.Question, *call.Refusal) {
	return func(context.Context, *exchange) (call.Question, *call.Refusal) { return call.Question{}, rf }
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

// end is how the exchange's call ends: the status the sandbox got, tokens from the usage parser.
func (x *exchange) end() call.End {
	if x.usage != nil {
		u := x.usage.Usage()
		x.c.SetUsage(u.In, u.Out)
		x.chargeTokens()
	}
	if x.echoed.Load() {
		x.c.CredentialEchoed()
	}
	switch {
	case x.truncated.Load():
		rf := call.Refuse(call.CodeUpstreamTruncated, "the upstream's response ended before it was complete")
		if x.tooLarge.Load() {
			rf = call.Refuse(call.CodeUpstreamTooLarge, "the upstream's response decoded past its bound")
		}
		return call.Failed(rf)
	case x.ended != nil:
		return *x.ended
	}
	return call.Answered(x.status)
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
	p.serve(w, r, id, audit.KindHTTPRequest, func(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
		rest := strings.TrimPrefix(r.URL.EscapedPath(), routePrefix)
		name, rest, _ := strings.Cut(rest, "/")
		rest = "/" + rest
		x.c.Describe(audit.Target{Route: name})
		up := p.routes[name]
		if up == nil {
			return call.Question{}, call.Refuse(call.CodeNoRoute, "no route named %q", name)
		}
		x.up, x.dest = up, up.addr
		if hasDotSegment(rest) {
			return call.Question{}, call.Refuse(call.CodeBadPath, "path contains dot segments")
		}
		x.c.Describe(audit.Target{Host: auditHost(up.addr, up.scheme)})
		return p.askForward(w, r, x, rest)
	})
}

// serveForward handles a plain-HTTP absolute-URI request (GET http://host/path).
func (p *Proxy) serveForward(w http.ResponseWriter, r *http.Request, id identity.Identity) {
	p.serve(w, r, id, audit.KindHTTPRequest, func(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
		if r.URL.Scheme != "http" {
			return call.Question{}, call.Refuse(call.CodeBadScheme, "only http:// absolute URIs are forwarded; use CONNECT for https")
		}
		dest, err := hostport.Parse(r.URL.Host, 80)
		if err != nil {
			return call.Question{}, call.Refuse(call.CodeBadHost, "%v", err)
		}
		x.up, x.dest = p.plain, dest
		x.c.Describe(audit.Target{Host: auditHost(dest, "http")})
		return p.askForward(w, r, x, r.URL.EscapedPath())
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

// askForward is the question of a request the proxy forwards: the policy input, with the
// model request read from the body (kept on x for forward). x.up and x.dest are set; path is
// the escaped upstream path (before the base path).
func (p *Proxy) askForward(w http.ResponseWriter, r *http.Request, x *exchange, path string) (call.Question, *call.Refusal) {
	unescaped, err := url.PathUnescape(path)
	if err != nil {
		return call.Question{}, call.Refuse(call.CodeBadPath, "path does not unescape")
	}
	in := &policy.Input{Kind: audit.KindHTTPRequest, Identity: x.c.Identity(), HTTP: &policy.HTTP{
		Method: r.Method, Host: x.dest.Host, Port: x.dest.Port, Path: unescaped, Route: x.up.route, MaxTokens: -1}}
	x.c.Describe(audit.Target{Path: unescaped})
	x.rawPath = path
	if !in.Identity.Known {
		// Identity first, as ServeHTTP does for a new request: a caller that stopped being a
		// sandbox mid-tunnel (its pod deleted) gets the same answer, its body never read.
		return call.Question{}, call.Refuse(call.CodeUnknownCaller, "caller is not a known sandbox")
	}
	l := p.cfg.Limits
	x.body = call.BoundBody(w, r, call.BodyTiming{Timeout: l.BodyTimeout.D(), MinRate: l.MinBodyRate})
	body, rf := p.readModelRequest(r, x, in)
	if rf != nil {
		return call.Question{}, rf
	}
	x.read = body
	configured := ""
	if x.up.cred != nil {
		configured = x.up.cred.Name
	}
	return call.Question{Input: in, Admit: true, Credential: configured}, nil
}

// forward is the act of a request the proxy forwards, allowed: the credential policy's grant
// names, the request through the reverse proxy, and how its call ends.
func (p *Proxy) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, x *exchange, g call.Grant) (end call.End) {
	x.cred = g.Credential
	if slot := x.c.GuardSlot(); slot != nil {
		x.set, x.setGen = p.scrub.ForSlot(slot)
	}
	r2 := r.WithContext(context.WithValue(ctx, exchangeKey{}, x))
	if x.read != nil {
		r2.Body = io.NopCloser(bytes.NewReader(x.read))
		r2.ContentLength = int64(len(x.read))
		x.c.BytesIn.Store(int64(len(x.read)))
	} else if r.Body != nil && r.Body != http.NoBody {
		r2.Body = &countingReader{ReadCloser: r.Body, n: &x.c.BytesIn}
	}
	sw := &statusWriter{ResponseWriter: w, x: x}
	defer func() { // also when ReverseProxy abandons the response mid-body (a panic serve re-raises)
		x.aborted = recover()
		x.status = sw.status
		if sw.writeFailed || clientGone(r.Context()) {
			x.c.Note(call.CodeClientClosed)
		}
		end = x.end()
	}()
	p.rp.ServeHTTP(sw, r2)
	return call.End{}
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
		// that is not compressed: Sandgate asks for gzip only, and modifyResponse decodes every
		// layer the upstream sends (or refuses the response).
		out.Header.Set("Accept-Encoding", "gzip")
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
// run's minted tokens (respguard.Source.For, ForSlot). The transport's goroutines call it too
// (1xx responses): it writes nothing of x.
func (x *exchange) needles() *respguard.Needles {
	if x.set != nil {
		if x.p.scrub.Generation() == x.setGen {
			return x.set
		}
		set, _ := x.p.scrub.ForSlot(x.c.GuardSlot())
		return set
	}
	id := x.c.Identity()
	return x.p.scrub.For(id.Namespace, id.Sandbox)
}

// modifyResponse guards a response before any of it is relayed: its header and announced
// trailers scrubbed, a partial answer to a credentialed request refused, and where Sandgate
// reads the body, its media type taken from every Content-Type line (lines that disagree are
// refused) and every coding decoded (respguard: fields.go, coding.go).
func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeFrom(resp.Request.Context())
	set := x.needles()
	if set.ScrubHeader(resp.Header) || set.ScrubHeader(resp.Trailer) {
		x.credentialEchoed()
	}
	if x.up.cred != nil && respguard.Partial(resp) {
		return errPartial
	}
	contentType := resp.Header.Get("Content-Type")
	if x.reads() {
		mt, err := respguard.MediaType(resp.Header)
		if err != nil {
			return err
		}
		if err := respguard.Decode(resp); err != nil {
			return err
		}
		contentType = mt
	}
	if x.up.api != config.APINone {
		x.usage = NewUsageParser(contentType)
	}
	end := newStreamEnd(contentType, x.up.api)
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
	x           *exchange
	status      int
	writeFailed bool // a write to the sandbox failed: it went away (clientgone.go)
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
	n, err := s.ResponseWriter.Write(b)
	if err != nil {
		s.writeFailed = true
	}
	return n, err
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
