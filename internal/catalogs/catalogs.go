// Package catalogs keeps the last catalog each MCP upstream listed (its tools, resources,
// templates and prompts, as the gateway encodes them), so that a gateway that starts while an
// upstream is down still lists that upstream's tools, whose calls answer upstream_unavailable,
// instead of dropping them until it connects. One replica keeps them in a file beside the audit
// log; several share them in Redis.
package catalogs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/atomicfile"
)

// MaxSize bounds one stored catalog, and a file of them, when they are read back: a catalog is
// an upstream's own text, kept only as long as it is sane.
const MaxSize = 16 << 20

// File keeps the catalogs in one JSON file (an object by upstream name), rewritten whole and
// atomically on each change. It is safe for concurrent use.
type File struct {
	path string
	mu   sync.Mutex
}

// NewFile keeps the catalogs at path (FileName in the audit folder).
func NewFile(path string) *File { return &File{path: path} }

// FileName is the file's name beside the audit log.
const FileName = "upstream-catalogs.json"

// Load returns the catalog stored for upstream, nil when there is none.
func (f *File) Load(_ context.Context, upstream string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, err := f.read()
	if err != nil {
		return nil, err
	}
	return all[upstream], nil
}

// Save stores b as upstream's catalog.
func (f *File) Save(_ context.Context, upstream string, b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	all, err := f.read()
	if err != nil {
		all = map[string]json.RawMessage{} // an unreadable file is replaced, not kept failing
	}
	all[upstream] = b
	out, err := json.Marshal(all)
	if err != nil {
		return fmt.Errorf("encode upstream catalogs: %w", err)
	}
	return atomicfile.Write(f.path, out, 0o600)
}

func (f *File) read() (map[string]json.RawMessage, error) {
	fh, err := os.Open(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]json.RawMessage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read upstream catalogs: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read upstream catalogs: %w", err)
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("read upstream catalogs: %s is larger than %d bytes", f.path, MaxSize)
	}
	all := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("read upstream catalogs from %s: %w", f.path, err)
	}
	return all, nil
}

// Redis keeps the catalogs in one hash, prefix + "upstream-catalogs", by upstream name, shared by
// every replica. Every call is bounded by timeout.
type Redis struct {
	client  redis.UniversalClient
	key     string
	timeout time.Duration
}

// NewRedis keeps the catalogs in Redis.
func NewRedis(client redis.UniversalClient, prefix string, timeout time.Duration) *Redis {
	if timeout <= 0 {
		timeout = time.Second
	}
	return &Redis{client: client, key: prefix + "upstream-catalogs", timeout: timeout}
}

// Load returns the catalog stored for upstream, nil when there is none.
func (s *Redis) Load(ctx context.Context, upstream string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.client.HStrLen(ctx, s.key, upstream).Result()
	if err != nil {
		return nil, fmt.Errorf("read upstream catalog from redis: %w", err)
	}
	if n > MaxSize {
		return nil, fmt.Errorf("read upstream catalog from redis: %d bytes, more than %d", n, MaxSize)
	}
	b, err := s.client.HGet(ctx, s.key, upstream).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read upstream catalog from redis: %w", err)
	}
	return b, nil
}

// Save stores b as upstream's catalog.
func (s *Redis) Save(ctx context.Context, upstream string, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.HSet(ctx, s.key, upstream, b).Err(); err != nil {
		return fmt.Errorf("store upstream catalog in redis: %w", err)
	}
	return nil
}

// Saved is an upstream's catalog as stored: every entry as the upstream listed it, and the
// server it was listed from.
type Saved struct {
	// Source is the upstream's URL or command line: a catalog of another server is not used.
	Source    string    `json:"source"`
	Saved     time.Time `json:"saved"`
	Tools     []Entry   `json:"tools,omitempty"`
	Resources []Entry   `json:"resources,omitempty"`
	Templates []Entry   `json:"templates,omitempty"`
	Prompts   []Entry   `json:"prompts,omitempty"`
	// Meta is each list result's own _meta, by list method; TTL its ttlMs (2026-07-28).
	Meta map[mcp.MCPMethod]json.RawMessage `json:"meta,omitempty"`
	TTL  map[mcp.MCPMethod]int64           `json:"ttl_ms,omitempty"`
}

// Entry is one entry of a list, by its ID (name, URI or URI template).
type Entry struct {
	ID  string          `json:"id"`
	Raw json.RawMessage `json:"raw"`
}

// Same compares two saved catalogs but for when they were saved.
func Same(a, b []byte) bool {
	var x, y Saved
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	x.Saved, y.Saved = time.Time{}, time.Time{}
	ea, _ := json.Marshal(x)
	eb, _ := json.Marshal(y)
	return string(ea) == string(eb)
}
