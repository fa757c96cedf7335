package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/limits"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/proxy/hostport"
)

const routePrefix = "/routes/"

// refusal is a request Sandgate answers itself. Code is bounded (metric label, audit error).
type refusal struct {
	Status int
	Code   string
	Reason string
	Close  bool
}

// exchange is one decided request (or one tunnel) on its way to exactly one audit event.
type exchange struct {
	p       *Proxy
	start   time.Time
	ev      audit.Event
	up      *upstream
	dest    hostport.Addr
	cred    string // credential value, never logged or audited
	rawPath string // escaped upstream path below the base path
	usage   *UsageParser
	span    trace.Span
	charged int64  // tokens of usage already charged to the caller's budget
	spent   string // the limit code that ends a streamed response after its current event
	status  int
	in      atomic.Int64
	out     atomic.Int64
	done    atomic.Bool
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

func (p *Proxy) newExchange(r *http.Request, id identity.Identity, kind string) *exchange {
	x := &exchange{p: p, start: time.Now()}
	_, x.span = p.tracer.Start(r.Context(), "proxy "+kind, trace.WithSpanKind(trace.SpanKindServer))
	x.ev = audit.Event{Kind: kind, Identity: id, Target: audit.Target{Method: r.Method, Host: r.Host}}
	if r.URL != nil && r.Method != http.MethodConnect {
		x.ev.Target.Path = r.URL.Path
	}
	return x
}

// refuse answers the request itself and audits it.
func (x *exchange) refuse(w http.ResponseWriter, rf refusal) {
	x.status = rf.Status
	x.ev.Decision.Allow = false
	x.ev.Decision.Reason = rf.Reason
	x.ev.Outcome.Error = rf.Code
	if rf.Close {
		w.Header().Set("Connection", "close")
	}
	writeRefusal(w, rf)
	x.finish()
}

// limitRefusal is the answer to a request refused by a budget or rate limit: 429, or 503 when
// the limits store cannot be reached.
func limitRefusal(deny *policy.Decision) refusal {
	status := http.StatusTooManyRequests
	if deny.Code == string(limits.CodeStoreUnavailable) {
		status = http.StatusServiceUnavailable
	}
	return refusal{Status: status, Code: deny.Code, Reason: deny.Reason}
}

func refusalBody(rf refusal) []byte {
	typ := "permission_error"
	switch {
	case rf.Status == http.StatusNotFound:
		typ = "not_found_error"
	case rf.Status >= 500:
		typ = "api_error"
	case rf.Status == http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case rf.Status != http.StatusForbidden:
		typ = "invalid_request_error"
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{
		"type": typ, "message": "sandgate: " + rf.Reason, "code": rf.Code}})
	return b
}

func writeRefusal(w http.ResponseWriter, rf refusal) {
	b := refusalBody(rf)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(rf.Status)
	_, _ = w.Write(b)
}

// finish writes the exchange's one audit event and its metrics. Later calls do nothing.
func (x *exchange) finish() {
	if x.done.Swap(true) {
		return
	}
	d := time.Since(x.start)
	ev := &x.ev
	ev.Outcome.Status = x.status
	ev.Outcome.DurationMS = float64(d.Microseconds()) / 1000
	ev.Outcome.BytesIn, ev.Outcome.BytesOut = x.in.Load(), x.out.Load()
	if x.usage != nil {
		u := x.usage.Usage()
		ev.Outcome.TokensIn, ev.Outcome.TokensOut = u.In, u.Out
		x.chargeTokens()
	}
	if ev.Decision.PolicyRevision == "" {
		ev.Decision.PolicyRevision = x.p.opts.Policy.Revision()
	}
	code := ev.Outcome.Error
	if code == "" {
		code = "ok"
	}
	attrs := x.p.m.requestAttrs.Get(requestAttrs{kind: ev.Kind, code: code, allow: ev.Decision.Allow})
	ctx := context.Background()
	x.p.m.requests.Add(ctx, 1, attrs)
	x.p.m.duration.Record(ctx, d.Seconds(), attrs)
	if ev.Outcome.TokensIn+ev.Outcome.TokensOut > 0 {
		x.p.m.tokens.Add(ctx, ev.Outcome.TokensIn, x.p.m.tokensIn)
		x.p.m.tokens.Add(ctx, ev.Outcome.TokensOut, x.p.m.tokensOut)
	}
	if sc := x.span.SpanContext(); sc.IsValid() {
		ev.TraceID = sc.TraceID().String()
		x.span.SetAttributes(
			attribute.String("sandgate.identity.namespace", ev.Identity.Namespace),
			attribute.String("sandgate.identity.sandbox", ev.Identity.Sandbox),
			attribute.String("sandgate.identity.template", ev.Identity.Template),
			attribute.Bool("sandgate.decision.allow", ev.Decision.Allow),
			attribute.String("sandgate.decision.code", code),
			attribute.String("sandgate.upstream", ev.Target.Host),
			attribute.String("sandgate.route", ev.Target.Route),
			attribute.Int("http.response.status_code", ev.Outcome.Status),
		)
	}
	x.span.End()
	if err := x.p.opts.Audit.Record(ev); err != nil {
		x.p.log.Error("audit event not recorded", "kind", ev.Kind, "sandbox", ev.Identity.Key(), "err", err)
	}
}

// serveRoute handles /routes/NAME/rest.
func (p *Proxy) serveRoute(w http.ResponseWriter, r *http.Request) {
	x := p.newExchange(r, identity.FromRemoteAddr(p.opts.Identity, r.RemoteAddr), audit.KindHTTPRequest)
	rest := strings.TrimPrefix(r.URL.EscapedPath(), routePrefix)
	name, rest, _ := strings.Cut(rest, "/")
	rest = "/" + rest
	x.ev.Target.Route = name
	up := p.routes[name]
	if up == nil {
		x.refuse(w, refusal{Status: http.StatusNotFound, Code: "no_route", Reason: fmt.Sprintf("no route named %q", name)})
		return
	}
	if hasDotSegment(rest) {
		x.refuse(w, refusal{Status: http.StatusBadRequest, Code: "bad_path", Reason: "path contains dot segments"})
		return
	}
	x.up, x.dest = up, up.addr
	x.ev.Target.Host = auditHost(up.addr, up.scheme)
	p.decideAndForward(w, r, x, rest)
}

// serveForward handles a plain-HTTP absolute-URI request (GET http://host/path).
func (p *Proxy) serveForward(w http.ResponseWriter, r *http.Request) {
	x := p.newExchange(r, identity.FromRemoteAddr(p.opts.Identity, r.RemoteAddr), audit.KindHTTPRequest)
	if r.URL.Scheme != "http" {
		x.refuse(w, refusal{Status: http.StatusBadRequest, Code: "bad_scheme", Reason: "only http:// absolute URIs are forwarded; use CONNECT for https"})
		return
	}
	dest, err := hostport.Parse(r.URL.Host, 80)
	if err != nil {
		x.refuse(w, refusal{Status: http.StatusBadRequest, Code: "bad_host", Reason: err.Error()})
		return
	}
	x.up, x.dest = p.plain, dest
	x.ev.Target.Host = auditHost(dest, "http")
	p.decideAndForward(w, r, x, r.URL.EscapedPath())
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

// decideAndForward is the one request path: policy input, decision, credential, forward,
// audit. x.up and x.dest are set; path is the escaped upstream path (before the base path).
func (p *Proxy) decideAndForward(w http.ResponseWriter, r *http.Request, x *exchange, path string) {
	if err := p.opts.Audit.Healthy(); err != nil {
		x.refuse(w, refusal{Status: http.StatusServiceUnavailable, Code: "audit_unavailable", Reason: "audit log unavailable"})
		return
	}
	unescaped, err := url.PathUnescape(path)
	if err != nil {
		x.refuse(w, refusal{Status: http.StatusBadRequest, Code: "bad_path", Reason: "path does not unescape"})
		return
	}
	in := &policy.Input{Kind: policy.KindHTTPRequest, Identity: x.ev.Identity, HTTP: &policy.HTTP{
		Method: r.Method, Host: x.dest.Host, Port: x.dest.Port, Path: unescaped, Route: x.up.route, MaxTokens: -1}}
	x.ev.Target.Path, x.rawPath = unescaped, path
	var body []byte
	if x.up.api != config.APINone && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		limit := p.cfg.Limits.BodyBytes
		body, err = readBody(r.Body, r.ContentLength, limit)
		if err != nil {
			x.refuse(w, refusal{Status: http.StatusBadRequest, Code: "body_read_failed", Reason: "reading the request body failed"})
			return
		}
		if int64(len(body)) > limit {
			x.refuse(w, refusal{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Close: true,
				Reason: fmt.Sprintf("model request body exceeds %d bytes; the model cannot be checked", limit)})
			return
		}
		if len(body) > 0 {
			mr, err := ParseModelRequest(body)
			if err != nil {
				x.refuse(w, refusal{Status: http.StatusBadRequest, Code: "bad_model_request", Reason: err.Error()})
				return
			}
			in.HTTP.Model, in.HTTP.MaxTokens, in.HTTP.Stream = mr.Model, mr.MaxTokens, mr.Stream
			x.ev.Target.Model = mr.Model
		}
	}
	if deny := p.opts.Admission.Admit(r.Context(), in); deny != nil {
		x.refuse(w, limitRefusal(deny))
		return
	}
	d := p.opts.Policy.Decide(r.Context(), in)
	x.ev.Decision = audit.Decision{Allow: d.Allow, Reason: d.Reason, PolicyRevision: d.Revision}
	if !d.Allow {
		x.refuse(w, refusal{Status: http.StatusForbidden, Code: d.Code, Reason: d.Reason})
		return
	}
	if c := x.up.cred; c != nil {
		if d.Credential != "" && d.Credential != c.Name {
			x.refuse(w, refusal{Status: http.StatusForbidden, Code: "credential_not_configured",
				Reason: fmt.Sprintf("policy chose credential %q but this destination is configured with %q", d.Credential, c.Name)})
			return
		}
		v, ok := p.opts.Credentials.Get(c.Name)
		if !ok || v == "" {
			x.refuse(w, refusal{Status: http.StatusBadGateway, Code: "credential_unavailable", Reason: fmt.Sprintf("credential %q is not available", c.Name)})
			return
		}
		x.cred = v
		x.ev.Credential = c.Name
	} else if d.Credential != "" {
		x.refuse(w, refusal{Status: http.StatusForbidden, Code: "credential_not_configured",
			Reason: fmt.Sprintf("policy chose credential %q but this destination has no credential configured", d.Credential)})
		return
	}

	r2 := r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x))
	if body != nil {
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		x.in.Store(int64(len(body)))
	} else if r.Body != nil && r.Body != http.NoBody {
		r2.Body = &countingReader{ReadCloser: r.Body, n: &x.in}
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { // also when ReverseProxy aborts the handler mid-body
		x.status = sw.status
		x.finish()
	}()
	p.rp.ServeHTTP(sw, r2)
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
		u = &url.URL{Scheme: x.up.scheme, Host: host, Path: x.up.basePath + x.ev.Target.Path}
	}
	u.RawQuery = pr.In.URL.RawQuery
	out.URL = u
	out.Host = ""
	for _, h := range stripRequestHeaders {
		out.Header.Del(h)
	}
	for k := range out.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-forwarded-") {
			delete(out.Header, k)
		}
	}
	if x.up.api != config.APINone {
		out.Header.Del("Accept-Encoding")
	}
	if x.span.SpanContext().IsValid() {
		propagation.TraceContext{}.Inject(trace.ContextWithSpan(pr.Out.Context(), x.span), propagation.HeaderCarrier(out.Header))
	}
	if c := x.up.cred; c != nil {
		out.Header.Del(c.Header)
		out.Header.Set(c.Header, strings.Replace(c.Format, "{value}", x.cred, 1))
	}
}

func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeFrom(resp.Request.Context())
	values := p.opts.Credentials.Values()
	for k, vs := range resp.Header {
		if containsAny(vs, values) {
			delete(resp.Header, k)
		}
	}
	if x.up.api != config.APINone {
		x.usage = NewUsageParser(resp.Header.Get("Content-Type"))
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, x: x, lineEmpty: true}
	return nil
}

func containsAny(vs, secrets []string) bool {
	for _, v := range vs {
		for _, s := range secrets {
			if len(s) >= 4 && strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	if reason, ok := Denied(err); ok {
		var de *DialError
		errors.As(err, &de)
		x.ev.Decision.Allow = false
		x.ev.Decision.Reason = "destination denied by dial guard: " + string(reason)
		x.ev.Outcome.Error = string(reason)
		x.status = http.StatusForbidden
		writeRefusal(w, refusal{Status: http.StatusForbidden, Code: string(reason), Reason: de.Error()})
		return
	}
	x.ev.Outcome.Error = "upstream_error: " + err.Error()
	status := http.StatusBadGateway
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusGatewayTimeout
	}
	writeRefusal(w, refusal{Status: status, Code: "upstream_error", Reason: "upstream unavailable"})
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
// streamed (SSE) model response is charged to the caller's token budget line by line as usage
// appears in it; once the budget is spent the body ends (io.EOF) at the end of that event.
type countingBody struct {
	io.ReadCloser
	x         *exchange
	lineEmpty bool // the SSE line being read has no content yet
	ended     bool
}

func (c *countingBody) Read(b []byte) (int, error) {
	if c.ended {
		return 0, io.EOF
	}
	n, err := c.ReadCloser.Read(b)
	if n > 0 && c.x.usage != nil {
		if c.x.usage.sse && c.x.p.opts.Admission != nil {
			n = c.feedSSE(b[:n])
		} else {
			_, _ = c.x.usage.Write(b[:n])
		}
	}
	c.x.out.Add(int64(n))
	if c.ended {
		return n, io.EOF
	}
	return n, err
}

// feedSSE feeds p to the usage parser a line at a time, charging new usage after each line, and
// returns how much of p to pass on: all of it, or up to the blank line that ends the event in
// which the budget was found spent.
func (c *countingBody) feedSSE(p []byte) int {
	off := 0
	for off < len(p) {
		i := bytes.IndexByte(p[off:], '\n')
		if i < 0 {
			_, _ = c.x.usage.Write(p[off:])
			if len(bytes.TrimRight(p[off:], "\r")) > 0 {
				c.lineEmpty = false
			}
			return len(p)
		}
		line := p[off : off+i+1]
		_, _ = c.x.usage.Write(line)
		off += i + 1
		blank := c.lineEmpty && len(bytes.TrimRight(line[:len(line)-1], "\r")) == 0
		c.lineEmpty = true
		if blank && c.x.spent != "" {
			c.ended = true
			c.x.ev.Outcome.Error = c.x.spent
			return off
		}
		if !blank && c.x.spent == "" {
			c.x.chargeTokens()
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
	v := x.p.opts.Admission.AddTokens(context.Background(), x.ev.Identity, total-x.charged)
	x.charged = total
	if !v.Allowed && x.spent == "" {
		x.spent = string(v.Code)
	}
}

// statusWriter remembers the status; Unwrap keeps flushing (SSE) working.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
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
