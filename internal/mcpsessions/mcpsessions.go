// Package mcpsessions shares the MCP sessions of sandboxes between replicas: what a replica needs
// to continue a session another replica created (the source address it is bound to, the
// negotiated protocol version, the client's info and capabilities), kept in Redis for the idle
// timeout and refreshed while the session is used.
package mcpsessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/redis/go-redis/v9"
)

// Record is what a replica needs to continue a session.
type Record struct {
	// Peer is the source address that initialized the session; only it may use the session.
	Peer            string                 `json:"peer"`
	ProtocolVersion string                 `json:"protocol_version,omitempty"`
	ClientInfo      mcp.Implementation     `json:"client_info"`
	Capabilities    mcp.ClientCapabilities `json:"capabilities"`
	Initialized     bool                   `json:"initialized"`
}

// Store keeps session records by session ID. Implementations are safe for concurrent use.
type Store interface {
	// Put stores the record of session id for ttl, replacing an existing one.
	Put(ctx context.Context, id string, r Record, ttl time.Duration) error
	// Get returns the record of session id; found is false when there is none (expired or
	// terminated).
	Get(ctx context.Context, id string) (r Record, found bool, err error)
	// Refresh extends the record's life to ttl from now and says what it found.
	Refresh(ctx context.Context, id string, ttl time.Duration) (State, error)
	// Terminate replaces the record by a marker that the session was terminated, kept for ttl, so
	// that the replicas that serve it stop doing so.
	Terminate(ctx context.Context, id string, ttl time.Duration) error
}

// State is what Refresh found.
type State int

// States of a shared session. Missing differs from Terminated: a Redis that lost its data
// (restart without persistence, failover to an empty replica) must not end live sessions, so a
// replica that holds a Missing session shares it again.
const (
	Missing State = iota
	Live
	Terminated
)

// terminated is the value of a terminated session's key.
const terminated = "terminated"

// Redis is a Store in Redis under prefix + "mcp-session:" + id, one JSON string per session
// expiring with it. Every call is bounded by timeout.
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
}

var _ Store = (*Redis)(nil)

// NewRedis returns a Store in Redis (prefix is config redis.key_prefix).
func NewRedis(client redis.UniversalClient, prefix string, timeout time.Duration) *Redis {
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	return &Redis{client: client, prefix: prefix, timeout: timeout}
}

func (s *Redis) key(id string) string { return s.prefix + "mcp-session:" + id }

// Put implements Store.
func (s *Redis) Put(ctx context.Context, id string, r Record, ttl time.Duration) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode mcp session %s: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.Set(ctx, s.key(id), b, ttl).Err(); err != nil {
		return fmt.Errorf("store mcp session in redis: %w", err)
	}
	return nil
}

// Get implements Store.
func (s *Redis) Get(ctx context.Context, id string) (Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	b, err := s.client.Get(ctx, s.key(id)).Bytes()
	if errors.Is(err, redis.Nil) || string(b) == terminated {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read mcp session from redis: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, false, fmt.Errorf("decode mcp session %s: %w", id, err)
	}
	return r, true, nil
}

// refreshScript: ARGV ttl ms. Returns the State.
var refreshScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == '` + terminated + `' then return 2 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
`)

// Refresh implements Store.
func (s *Redis) Refresh(ctx context.Context, id string, ttl time.Duration) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	st, err := refreshScript.Run(ctx, s.client, []string{s.key(id)}, ttl.Milliseconds()).Int()
	if err != nil {
		return Missing, fmt.Errorf("refresh mcp session in redis: %w", err)
	}
	return State(st), nil
}

// Terminate implements Store.
func (s *Redis) Terminate(ctx context.Context, id string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.Set(ctx, s.key(id), terminated, ttl).Err(); err != nil {
		return fmt.Errorf("terminate mcp session in redis: %w", err)
	}
	return nil
}
