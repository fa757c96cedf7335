// Package proxy is Sandgate's egress side: a forward proxy (CONNECT with TLS interception for
// configured hosts, plain tunnels, plain-HTTP absolute-URI requests) and base-URL routes
// (/routes/NAME/...), on one listener. Sandboxes hold placeholder keys; the proxy decides every
// request with the policy engine, injects the real credential and writes one audit event.
//
// Every request follows the one request path of internal/call, which the MCP gateway shares;
// exchange.go is the proxy's shape of it: identity from the TCP peer → policy input (with
// model, max_tokens and stream read from a model-API body) → call.Authorize (audit health,
// admission, decision) → credential injection → the pooled upstream transport behind the dial
// guard → one audit event with status, bytes, latency and token usage. CONNECT tunnels
// (connect.go) get one audit event each, written when the tunnel closes. Connections are served
// by internal/httpconn, as the MCP listener's are: a request refused before it can be read as
// one — a smuggling attempt, an oversized or malformed head, a head cut by the header timeout —
// is one http.rejected event, rate-limited per source address.
//
// What is stripped, checked and refused is documented on Proxy.
package proxy
