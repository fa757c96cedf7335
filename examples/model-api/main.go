// Command model-api is a local stand-in for the Anthropic Messages API, so that `make run`'s
// egress tour answers without internet access or an API key. examples/sandgate.yaml dials it
// for api.anthropic.com:443 (proxy.connect_to): the sandbox, the policy and the audit event
// still see api.anthropic.com, and Sandgate verifies the stand-in's certificate for that name
// against the CA this command writes (make run gives it to Sandgate with SSL_CERT_FILE).
//
// POST /v1/messages answers like the real API (JSON, or server-sent events with "stream":
// true), with usage Sandgate charts and charges. A request whose x-api-key is not the key in
// -key-file gets the real API's 401: an answer proves Sandgate injected its key in place of the
// sandbox's placeholder. The key is never logged or echoed.
//
//	model-api -init -dir var/model-api                  write the CA (ca.crt, ca.key) and exit
//	model-api -listen 127.0.0.1:8443 -dir var/model-api -key-file var/secrets/anthropic
package main

import (
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandgate/sandgate/proxy"
)

// maxBody bounds what a request may send: the stand-in reads it whole.
const maxBody = 1 << 20

func main() {
	listen := flag.String("listen", "127.0.0.1:8443", "address to serve TLS on (examples/sandgate.yaml's proxy.connect_to)")
	dir := flag.String("dir", "var/model-api", "folder of the CA that signs the stand-in's certificates (ca.crt, ca.key)")
	keyFile := flag.String("key-file", "var/secrets/anthropic", "the API key requests must carry (what Sandgate injects)")
	initCA := flag.Bool("init", false, "write the CA into -dir (if it is not there) and exit")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("model-api: ")
	certPath, keyPath := filepath.Join(*dir, proxy.CACertFile), filepath.Join(*dir, proxy.CAKeyFile)
	if *initCA {
		if _, err := os.Stat(certPath); err == nil {
			return
		}
		if _, _, err := proxy.InitCA(*dir, false, time.Now()); err != nil {
			log.Fatal(err)
		}
		return
	}
	ca, err := proxy.LoadCA(certPath, keyPath)
	if err != nil {
		log.Fatalf("%v (create it with: model-api -init -dir %s)", err, *dir)
	}
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		log.Fatalf("read the expected API key: %v", err)
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           &messages{key: strings.TrimSpace(string(key))},
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if h.ServerName == "" {
				return ca.Leaf("api.anthropic.com")
			}
			return ca.Leaf(h.ServerName)
		}},
	}
	// Bound before anything is printed: the first line says whether it serves, and `make run`
	// waits for it before starting Sandgate.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("cannot listen on %s (%v): stop what holds it, or run make run MODEL_API=127.0.0.1:PORT "+
			"with the same address in examples/sandgate.yaml's proxy.connect_to", *listen, err)
	}
	log.Printf("serving a stand-in Anthropic Messages API on https://%s (certificates from %s)", ln.Addr(), certPath)
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// messages serves POST /v1/messages.
type messages struct {
	key string
}

type request struct {
	Model     string `json:"model"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (m *messages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Request-Id", fmt.Sprintf("req_standin_%d", time.Now().UnixNano()))
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		apiError(w, http.StatusNotFound, "not_found_error", "the stand-in serves POST /v1/messages only")
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Api-Key")), []byte(m.key)) != 1 {
		log.Printf("%s %s: refused, x-api-key is not the key Sandgate holds", r.Method, r.URL.Path)
		apiError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
		return
	}
	var req request
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	switch {
	case err != nil:
		apiError(w, http.StatusBadRequest, "invalid_request_error", "the body is not a Messages API request: "+err.Error())
		return
	case req.Model == "" || req.MaxTokens < 1 || len(req.Messages) == 0:
		apiError(w, http.StatusBadRequest, "invalid_request_error", "model, max_tokens (> 0) and messages are required")
		return
	}
	words := strings.Fields(fmt.Sprintf("Hello from the local stand-in model API (examples/model-api). "+
		"This request carried the key Sandgate holds, injected in place of the sandbox's. You said: %s", lastText(req)))
	stop := "end_turn"
	if len(words) > req.MaxTokens {
		words, stop = words[:req.MaxTokens], "max_tokens"
	}
	log.Printf("%s %s: model %s, %d output tokens, stream %t, injected key accepted", r.Method, r.URL.Path, req.Model, len(words), req.Stream)
	inTokens := max(1, len(body)/4) // about four bytes a token: enough for usage and budgets
	if req.Stream {
		stream(w, req.Model, words, stop, inTokens)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(message{ID: "msg_standin", Type: "message", Role: "assistant", Model: req.Model,
		Content: []textBlock{{Type: "text", Text: strings.Join(words, " ")}}, StopReason: stop,
		Usage: usage{InputTokens: inTokens, OutputTokens: len(words)}})
}

// message is a Messages API answer, its fields in the real API's order.
type message struct {
	ID           string      `json:"id"`
	Type         string      `json:"type"`
	Role         string      `json:"role"`
	Model        string      `json:"model"`
	Content      []textBlock `json:"content"`
	StopReason   string      `json:"stop_reason"`
	StopSequence *string     `json:"stop_sequence"`
	Usage        usage       `json:"usage"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// stream answers as the Messages API's server-sent events, one word per delta.
func stream(w http.ResponseWriter, model string, words []string, stop string, inTokens int) {
	w.Header().Set("Content-Type", "text/event-stream")
	f, _ := w.(http.Flusher)
	event := func(name string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if f != nil {
			f.Flush()
		}
	}
	event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_standin", "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": inTokens, "output_tokens": 1}}})
	event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
	for i, word := range words {
		if i > 0 {
			word = " " + word
		}
		event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": word}})
	}
	event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": len(words)}})
	event("message_stop", map[string]string{"type": "message_stop"})
}

// lastText is the text of the last message: a string, or the text blocks of a content array.
func lastText(req request) string {
	raw := req.Messages[len(req.Messages)-1].Content
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var parts []string
	for _, b := range blocks {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, " ")
}

func apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}
