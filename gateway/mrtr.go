package gateway

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// 2026-07-28 has no requests from server to client: an upstream that needs something of the
// client mid-request (elicitation, sampling, roots) answers with a result of resultType
// "input_required" carrying its input requests and an opaque requestState, and the client sends
// the request again (a new JSON-RPC ID) with inputResponses and that requestState (SEP-2322).
// For a sandbox on 2026-07-28 the gateway keeps that exchange whatever its upstream speaks:
//   - a 2026-07-28 upstream's input_required is relayed as written, its requestState sealed in
//     one of Sandgate's (the retry's is unsealed and the upstream's sent on);
//   - a legacy upstream asks with a request on the call's stream, which a 2026-07-28 sandbox
//     cannot receive: the upstream call is parked (kept running, its request unanswered), the
//     sandbox gets input_required with that request, and its retry answers the upstream's
//     request and resumes the same upstream call, whose stream then goes to the retry.
// A sealed state is bound to the sandbox and to the request (method, target): another sandbox,
// or the same one for another tool, cannot use it (it is refused as invalid params), and it
// expires. Sealing is authenticated encryption under a key of this replica's: the upstream's
// state is never readable by the sandbox, and a parked call lives on the replica that parked
// it (a retry elsewhere is refused and the client sends the request again without it).

// stateTTL bounds how long a sealed state, and a parked call, wait for the retry.
const stateTTL = 10 * time.Minute

// sealedState is what a sealed requestState holds.
type sealedState struct {
	Parked   string `json:"p,omitempty"` // a parked call's handle
	Upstream string `json:"u,omitempty"` // the upstream's own requestState
	Sandbox  string `json:"s"`
	Method   string `json:"m"`
	Target   string `json:"t"`
	Expires  int64  `json:"e"`
}

// stateSealer seals and opens request states.
type stateSealer struct{ aead cipher.AEAD }

func newStateSealer() *stateSealer {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	block, _ := aes.NewCipher(key)
	aead, _ := cipher.NewGCM(block)
	return &stateSealer{aead: aead}
}

func (s *stateSealer) seal(st sealedState) string {
	plain, _ := json.Marshal(st)
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, nil))
}

// errStateRefused is a requestState that is not one of Sandgate's for this request.
var errStateRefused = errors.New("requestState is unknown, expired, or not this request's; send the request again without it")

// open is the state sealed in raw for request x, or errStateRefused.
func (s *stateSealer) open(raw string, x *exchange) (sealedState, error) {
	var st sealedState
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil || len(b) < s.aead.NonceSize() {
		return st, errStateRefused
	}
	plain, err := s.aead.Open(nil, b[:s.aead.NonceSize()], b[s.aead.NonceSize():], nil)
	if err != nil || json.Unmarshal(plain, &st) != nil {
		return st, errStateRefused
	}
	if st.Sandbox != x.id.Key() || st.Method != x.msg.Method || st.Target != x.up.cfg.Name+"/"+x.name ||
		time.Now().Unix() > st.Expires {
		return st, errStateRefused
	}
	return st, nil
}

// stateFor is the state to seal for request x.
func stateFor(x *exchange) sealedState {
	return sealedState{Sandbox: x.id.Key(), Method: x.msg.Method, Target: x.up.cfg.Name + "/" + x.name,
		Expires: time.Now().Add(stateTTL).Unix()}
}

// resume serves a retry that carries a requestState (and its inputResponses).
func (x *exchange) resume(ctx context.Context) (response, call.End) {
	st, err := x.g.sealer.open(jsonscan.String(x.msg.p.requestState), x)
	if err != nil {
		return x.stateRefused()
	}
	if st.Parked != "" {
		p := x.g.parked.take(st.Parked)
		if p == nil {
			return x.stateRefused()
		}
		return p.resume(ctx, x)
	}
	params := x.relayParams()
	if st.Upstream != "" {
		params = params.with("requestState", jsonenc.AppendString(nil, st.Upstream))
	}
	if x.msg.p.inputResponses != nil {
		params = params.with("inputResponses", x.msg.p.inputResponses)
	}
	res, err := x.send(ctx, params)
	return x.answerWith(res, err)
}

// stateRefused answers a retry whose requestState is not one of Sandgate's for it.
func (x *exchange) stateRefused() (response, call.End) {
	rf := call.Refuse(call.CodeBadParams, "%v", errStateRefused)
	return x.respond(x.rpcError(codeInvalidParams, rf.Reason, refusalData{Code: rf.Code})), call.Denied(rf)
}

// sealInputRequired is res, a 2026-07-28 upstream's input_required result, with its
// requestState sealed for x.
func (x *exchange) sealInputRequired(res []byte) []byte {
	var upstreamState, resultType string
	_ = jsonscan.Named(res, []string{"requestState", "resultType"}, func(i int, v []byte) error {
		if i == 0 {
			upstreamState = jsonscan.String(v)
		} else {
			resultType = jsonscan.String(v)
		}
		return nil
	})
	if resultType != string(mcp.ResultTypeInputRequired) {
		return res
	}
	st := stateFor(x)
	st.Upstream = upstreamState
	out, err := jsonenc.WithMember(res, "requestState", jsonenc.AppendString(nil, x.g.sealer.seal(st)))
	if err != nil {
		return res
	}
	return out
}

// parkedCall is an upstream call of a 2026-07-28 sandbox kept running while the sandbox answers
// the upstream's request for input (in its retry).
type parkedCall struct {
	g      *Gateway
	handle string
	call   *inflightCall
	cancel context.CancelFunc
	done   chan result    // the upstream call's end (buffered)
	asks   chan *inputAsk // the upstream's requests for input, as they come
	// pending are the asks sent to the sandbox, by key, awaiting its retry.
	mu      sync.Mutex
	pending map[string]*inputAsk
	expires time.Time
}

// result is an upstream call's end.
type result struct {
	raw json.RawMessage
	err error
}

// inputAsk is one request of the upstream's for input, asked of a 2026-07-28 sandbox.
type inputAsk struct {
	key    string
	in     inbound
	answer chan clientReply // buffered
}

// parkedCalls are the parked calls of this replica, by handle.
type parkedCalls struct {
	mu   sync.Mutex
	byID map[string]*parkedCall
	keys atomic.Uint64
}

func newParkedCalls() *parkedCalls { return &parkedCalls{byID: map[string]*parkedCall{}} }

// take removes and returns parked call handle, nil when there is none.
func (pc *parkedCalls) take(handle string) *parkedCall {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	p := pc.byID[handle]
	delete(pc.byID, handle)
	return p
}

func (pc *parkedCalls) put(p *parkedCall) {
	pc.mu.Lock()
	p.expires = time.Now().Add(stateTTL)
	pc.byID[p.handle] = p
	pc.mu.Unlock()
}

// sweep ends the parked calls whose retry never came, until ctx ends.
func (pc *parkedCalls) sweep(ctx context.Context) {
	t := time.NewTicker(stateTTL / 10)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			pc.mu.Lock()
			for h, p := range pc.byID {
				if now.After(p.expires) {
					delete(pc.byID, h)
					p.cancel()
				}
			}
			pc.mu.Unlock()
		}
	}
}

// forwardParked forwards x, a 2026-07-28 sandbox's request, to an upstream that may ask for
// input on the call's stream: the upstream call runs apart from the request, so that it can
// outlive it while the sandbox answers.
func (x *exchange) forwardParked() (response, call.End) {
	g := x.g
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.r.Context()), x.up.cfg.CallTimeout.D()+stateTTL)
	p := &parkedCall{g: g, handle: strconv.FormatUint(g.parked.keys.Add(1), 36) + "-" + randomID(),
		cancel: cancel, done: make(chan result, 1), asks: make(chan *inputAsk, 8), pending: map[string]*inputAsk{}}
	params := x.relayParams()
	ctx, c, token := g.inflight.begin(context.WithValue(ctx, parkedKey{}, p), x, x.up)
	p.call = c
	params.token = token
	go func() {
		defer g.inflight.end(x.up, c)
		res, err := do(ctx, x.up, func(ctx context.Context, cli *client.Client) (json.RawMessage, error) {
			return rpc(ctx, cli, x.msg.Method, x.ownToken(params, c, cli))
		})
		p.done <- result{res, err}
	}()
	return p.wait(x)
}

type parkedKey struct{}

// resume goes on with the parked call for x, the sandbox's retry: the upstream's requests get
// their answers, and the call's stream is x's from now on.
func (p *parkedCall) resume(ctx context.Context, x *exchange) (response, call.End) {
	p.call.dest.Store(x)
	var answers map[string]json.RawMessage
	_ = json.Unmarshal(orNull(x.msg.p.inputResponses), &answers)
	p.mu.Lock()
	for key, a := range p.pending {
		if r, ok := answers[key]; ok {
			a.answer <- clientReply{result: r}
			delete(p.pending, key)
		}
	}
	p.mu.Unlock()
	return p.wait(x)
}

// wait answers x with what the parked call does next: its result, or input_required with the
// upstream's requests for input (the call stays parked for the retry).
func (p *parkedCall) wait(x *exchange) (response, call.End) {
	p.mu.Lock()
	outstanding := len(p.pending) > 0
	p.mu.Unlock()
	if outstanding { // inputs the retry did not give: asked again
		return p.inputRequired(x, nil)
	}
	select {
	case r := <-p.done:
		p.cancel()
		return x.answerWith(r.raw, r.err)
	case a := <-p.asks:
		return p.inputRequired(x, a)
	case <-x.r.Context().Done():
		p.cancel()
		return response{}, call.Cancelled()
	}
}

// inputRequired answers x with input_required: every request of the upstream's pending (a
// first, with those that came with it), and the parked call's sealed handle.
func (p *parkedCall) inputRequired(x *exchange, a *inputAsk) (response, call.End) {
	p.mu.Lock()
	if a != nil {
		p.pending[a.key] = a
	}
	for more := true; more; {
		select {
		case b := <-p.asks:
			p.pending[b.key] = b
		default:
			more = false
		}
	}
	reqs := make(map[string]json.RawMessage, len(p.pending))
	for key, b := range p.pending {
		reqs[key] = inputRequestBytes(b.in)
	}
	p.mu.Unlock()
	st := stateFor(x)
	st.Parked = p.handle
	body, _ := json.Marshal(struct {
		ResultType    mcp.ResultType             `json:"resultType"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
		RequestState  string                     `json:"requestState"`
	}{mcp.ResultTypeInputRequired, reqs, x.g.sealer.seal(st)})
	x.g.parked.put(p)
	return x.respond(x.result(body)), call.Answered(http.StatusOK)
}

// inputRequestBytes is an upstream's request as an input request: its method and params.
func inputRequestBytes(in inbound) json.RawMessage {
	b := jsonenc.AppendString([]byte(`{"method":`), in.method)
	if len(in.params) > 0 {
		b = append(append(b, `,"params":`...), in.params...)
	}
	return append(b, '}')
}

// askParked asks for input on a parked call: the request goes to the sandbox in the
// input_required of the request waiting on the call, and its answer comes with the retry.
func (p *parkedCall) askParked(ctx context.Context, in inbound, timeout time.Duration) (clientReply, bool) {
	a := &inputAsk{key: "sg-input-" + strconv.FormatUint(p.g.parked.keys.Add(1), 36), in: in, answer: make(chan clientReply, 1)}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select {
	case p.asks <- a:
	case <-ctx.Done():
		return clientReply{}, false
	}
	select {
	case r := <-a.answer:
		return r, true
	case <-ctx.Done():
		return clientReply{}, false
	}
}

func randomID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
