package pins

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/config"
)

// Credentials is where an upstream's credential values come from (*credential.Store).
type Credentials interface {
	Get(name string) (string, bool)
}

// allCapabilities are the client capabilities a tool may be listed for.
var allCapabilities = mcp.ClientCapabilities{
	Sampling:    &mcp.SamplingCapability{},
	Elicitation: &mcp.ElicitationCapability{},
	Roots: &struct {
		ListChanged bool `json:"listChanged,omitempty"`
	}{ListChanged: true},
}

// maxPages bounds the pages of a tools/list an upstream may answer with.
const maxPages = 1000

// ListTools connects to the upstream as the gateway does (mcp-go's client; an HTTP upstream
// gets its configured credential header, a stdio server is started with a clean environment:
// PATH, HOME, its env and credential_env), lists its tools, and returns each definition as the
// upstream wrote it. Every read is bounded by the upstream's max_message_bytes and
// max_response_bytes, and the whole by its connect and call timeouts.
func ListTools(ctx context.Context, u config.Upstream, creds Credentials) ([]json.RawMessage, error) {
	u.ApplyBounds()
	ctx, cancel := context.WithTimeout(ctx, u.ConnectTimeout.D()+u.CallTimeout.D())
	defer cancel()
	tr, stop, err := dial(ctx, u, creds)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", u.Name, err)
	}
	defer stop()
	// The definitions are read over the initialize handshake (a revision before 2026-07-28),
	// whose requests need no per-request metadata, with every client capability the gateway's
	// shared connection declares, so that the tools listed only to capable clients are pinned too.
	version := mcp.LATEST_LEGACY_PROTOCOL_VERSION
	if u.ProtocolVersion != "" && !mcp.IsModernProtocol(u.ProtocolVersion) {
		version = u.ProtocolVersion
	}
	cli := client.NewClient(tr, client.WithProtocolVersion(version), client.WithClientCapabilities(allCapabilities))
	if err := cli.Start(ctx); err != nil {
		return nil, fmt.Errorf("upstream %s: start: %w", u.Name, err)
	}
	defer cli.Close()
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = version
	init.Params.Capabilities = allCapabilities
	init.Params.ClientInfo = mcp.Implementation{Name: "sandgate-policy-pin", Version: "1"}
	if _, err := cli.Initialize(ctx, init); err != nil {
		return nil, fmt.Errorf("upstream %s: initialize: %w", u.Name, err)
	}
	if cli.GetServerCapabilities().Tools == nil {
		return nil, nil // an upstream without tools has none to pin
	}
	return listAll(ctx, cli, u.Name)
}

func listAll(ctx context.Context, cli *client.Client, name string) ([]json.RawMessage, error) {
	var out []json.RawMessage
	seen := map[string]bool{}
	cursor := ""
	for page := 0; page < maxPages; page++ {
		req := transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId(int64(page + 100)), Method: string(mcp.MethodToolsList)}
		if cursor != "" {
			req.Params = map[string]any{"cursor": cursor}
		}
		resp, err := cli.GetTransport().SendRequest(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: tools/list: %w", name, err)
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("upstream %s: tools/list: error %d", name, resp.Error.Code) // its text is the upstream's
		}
		var result struct {
			Tools      []json.RawMessage `json:"tools"`
			NextCursor string            `json:"nextCursor"`
		}
		if err := json.Unmarshal(resp.Result, &result); err != nil {
			return nil, fmt.Errorf("upstream %s: tools/list result: %w", name, err)
		}
		for _, t := range result.Tools {
			var id struct {
				Name string `json:"name"`
			}
			if json.Unmarshal(t, &id) == nil && seen[id.Name] {
				return nil, fmt.Errorf("upstream %s lists tool %q twice", name, id.Name)
			}
			seen[id.Name] = true
			out = append(out, t)
		}
		if result.NextCursor == "" {
			return out, nil
		}
		cursor = result.NextCursor
	}
	return nil, fmt.Errorf("upstream %s: tools/list has more than %d pages", name, maxPages)
}

// dial makes the upstream's transport and returns what stops what it started.
func dial(ctx context.Context, u config.Upstream, creds Credentials) (transport.Interface, func(), error) {
	if !u.IsStdio() {
		headers := map[string]string{}
		if c := u.Credential; c != nil {
			v, ok := creds.Get(c.Name)
			if !ok || v == "" {
				return nil, nil, fmt.Errorf("credential %q is not available", c.Name)
			}
			headers[c.Header] = c.Render(v)
		}
		hc := &http.Client{Transport: boundedTransport{max: u.MaxResponseBytes}}
		tr, err := transport.NewStreamableHTTP(u.URL, transport.WithHTTPBasicClient(hc), transport.WithHTTPHeaders(headers))
		if err != nil {
			return nil, nil, err
		}
		return tr, func() {}, nil
	}
	cmd := exec.CommandContext(ctx, u.Command, u.Args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range u.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, name := range u.CredentialEnv {
		v, ok := creds.Get(name)
		if !ok {
			return nil, nil, fmt.Errorf("credential %q for %s is not available", name, k)
		}
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", u.Command, err)
	}
	stop := func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	lines := &boundedLines{r: bufio.NewReader(stdout), max: u.MaxMessageBytes}
	return transport.NewIO(lines, stdin, io.NopCloser(strings.NewReader(""))), stop, nil
}

// errTooLong ends a read of a message over its bound.
var errTooLong = errors.New("upstream message over max_message_bytes")

// boundedLines passes a stdio server's output on, failing a line longer than max bytes.
type boundedLines struct {
	r    *bufio.Reader
	max  int64
	line int64
}

func (b *boundedLines) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	for _, c := range p[:n] {
		b.line++
		if c == '\n' {
			b.line = 0
		}
		if b.line > b.max {
			return 0, errTooLong
		}
	}
	return n, err
}

// boundedTransport fails a response body over max bytes.
type boundedTransport struct{ max int64 }

func (t boundedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &boundedBody{rc: resp.Body, left: t.max}
	return resp, nil
}

type boundedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errors.New("upstream response over max_response_bytes")
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }
