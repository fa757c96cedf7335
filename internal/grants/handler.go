package grants

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// NewHandler serves the grants admin API:
//
//	PUT    /v1/grants/{namespace}/claims/{claim}/{name}   body {"value": <any JSON>, "ttl": "30m"}
//	GET    /v1/grants/{namespace}/claims/{claim}          → {"grants": {name: value, …}}
//	DELETE /v1/grants/{namespace}/claims/{claim}/{name}
//	DELETE /v1/grants/{namespace}/claims/{claim}
//
// and the same four under /v1/grants/{namespace}/{sandbox} for grants of one sandbox by name.
// Claim grants are what a dispatcher should use: it knows the SandboxClaim it created, not the
// sandbox the claim is bound to (a warm-pool sandbox keeps the pool's name). They reach the
// sandbox the Kubernetes identity source verifies the claim is bound to (Identity.Claim). A
// sandbox literally named "claims" cannot use the sandbox form of the claim-shaped DELETE.
//
// Every request must carry "Authorization: Bearer <token>" where token is what token returns at
// that moment (so a rotated secret takes effect without a restart); while token returns "" every
// request is refused. The comparison is constant-time, lengths included. Errors are JSON
// {"error": "..."}: 401 without a valid token, 400 for a malformed body, TTL or name, 413 for an
// oversized body or value, 503 when the store cannot be reached.
func NewHandler(store Store, token func() string) http.Handler {
	h := &handler{store: store}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/grants/{namespace}/claims/{claim}/{name}", h.put)
	mux.HandleFunc("GET /v1/grants/{namespace}/claims/{claim}", h.get)
	mux.HandleFunc("DELETE /v1/grants/{namespace}/claims/{claim}/{name}", h.deleteOne)
	mux.HandleFunc("DELETE /v1/grants/{namespace}/claims/{claim}", h.deleteSandbox)
	mux.HandleFunc("PUT /v1/grants/{namespace}/{sandbox}/{name}", h.put)
	mux.HandleFunc("GET /v1/grants/{namespace}/{sandbox}", h.get)
	mux.HandleFunc("DELETE /v1/grants/{namespace}/{sandbox}/{name}", h.deleteOne)
	mux.HandleFunc("DELETE /v1/grants/{namespace}/{sandbox}", h.deleteSandbox)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/grants/") {
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s (PUT, GET or DELETE)", r.Method, r.URL.Path))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s; see the grants admin API", r.Method, r.URL.Path))
	})
	return authenticate(token, mux)
}

// maxBodyOverhead is what a PUT body may hold besides the value: the ttl and the JSON around it.
const maxBodyOverhead = 4 << 10

type handler struct{ store Store }

func authenticate(token func() string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := token()
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		// Hashing first makes the comparison constant-time in the token's length too.
		wantSum, gotSum := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(got))
		if want == "" || !ok || subtle.ConstantTimeCompare(wantSum[:], gotSum[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandgate-admin"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong admin bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

type putBody struct {
	Value json.RawMessage `json:"value"`
	TTL   string          `json:"ttl"`
}

func (h *handler) put(w http.ResponseWriter, r *http.Request) {
	key, name, ok := pathKey(w, r)
	if !ok {
		return
	}
	limit := int64(DefaultMaxValueSize + maxBodyOverhead)
	if l, ok := h.store.(interface{ maxValueSize() int }); ok {
		limit = int64(l.maxValueSize() + maxBodyOverhead)
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is larger than %d bytes", limit))
			return
		}
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var body putBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, `body is not {"value": <json>, "ttl": "30m"}: `+err.Error())
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "body has data after the JSON object")
		return
	}
	if len(body.Value) == 0 || string(body.Value) == "null" {
		writeError(w, http.StatusBadRequest, `"value" is required and must not be null`)
		return
	}
	if body.TTL == "" {
		writeError(w, http.StatusBadRequest, `"ttl" is required, for example "30m"`)
		return
	}
	ttl, err := time.ParseDuration(body.TTL)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"ttl" %q is not a duration such as "30m" or "2h"`, body.TTL))
		return
	}
	var value any
	if err := json.Unmarshal(body.Value, &value); err != nil {
		writeError(w, http.StatusBadRequest, "value: "+err.Error())
		return
	}
	if err := h.store.Put(r.Context(), key, name, value, ttl); err != nil {
		writeStoreError(w, err)
		return
	}
	target := "sandbox"
	if r.PathValue("claim") != "" {
		target = "claim"
	}
	writeJSON(w, http.StatusOK, map[string]any{
		target: r.PathValue("namespace") + "/" + r.PathValue(target), "name": name, "ttl": ttl.String(), "expires_at": time.Now().Add(ttl).UTC().Format(time.RFC3339),
	})
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	key, _, ok := pathKey(w, r)
	if !ok {
		return
	}
	g, err := h.store.Get(r.Context(), key)
	if err != nil {
		writeStoreError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"grants": g})
}

func (h *handler) deleteOne(w http.ResponseWriter, r *http.Request) {
	key, name, ok := pathKey(w, r)
	if !ok {
		return
	}
	if err := h.store.Delete(r.Context(), key, name); err != nil {
		writeStoreError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	key, _, ok := pathKey(w, r)
	if !ok {
		return
	}
	if err := h.store.DeleteSandbox(r.Context(), key); err != nil {
		writeStoreError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pathKey returns the store key (SandboxKey or ClaimKey) and grant name of the request path,
// writing a 400 when they are not Kubernetes names (or a valid grant name).
func pathKey(w http.ResponseWriter, r *http.Request) (key, name string, ok bool) {
	ns, sb, claim := r.PathValue("namespace"), r.PathValue("sandbox"), r.PathValue("claim")
	what, v := "sandbox", sb
	if claim != "" {
		what, v = "claim", claim
	}
	for _, p := range []struct{ what, v string }{{"namespace", ns}, {what, v}} {
		if !isDNSName(p.v) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s %q is not a Kubernetes name (lowercase letters, digits, '-', '.')", p.what, p.v))
			return "", "", false
		}
	}
	name = r.PathValue("name")
	if name != "" {
		if err := CheckName(name); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return "", "", false
		}
	}
	if claim != "" {
		return ClaimKey(ns, claim), name, true
	}
	return ns + "/" + sb, name, true
}

func isDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for i, r := range s {
		alnum := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		if !alnum && ((r != '-' && r != '.') || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

func writeStoreError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, "grant store unavailable: "+err.Error())
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
