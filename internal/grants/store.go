package grants

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Store holds grants by sandbox or by claim. sandboxKey is identity.Identity.Key()
// ("namespace/sandbox") or ClaimKey ("namespace/claims/claim", which no sandbox key can be: a
// Kubernetes name has no '/'). Implementations are safe for concurrent use.
type Store interface {
	// Put sets grant name of the sandbox to value (anything encoding/json accepts) for ttl,
	// replacing an existing grant of that name and its TTL.
	Put(ctx context.Context, sandboxKey, name string, value any, ttl time.Duration) error
	// Get returns the sandbox's unexpired grants by name, as decoded JSON (an empty map when it has
	// none). It is what the policy sees as input.grants.
	Get(ctx context.Context, sandboxKey string) (map[string]any, error)
	// Delete removes one grant; removing a grant that does not exist is not an error.
	Delete(ctx context.Context, sandboxKey, name string) error
	// DeleteSandbox removes all grants of the sandbox (when it goes away).
	DeleteSandbox(ctx context.Context, sandboxKey string) error
}

// ClaimKey is the store key of the grants of a SandboxClaim.
func ClaimKey(namespace, claim string) string { return namespace + "/claims/" + claim }

// Errors a Store returns for a request that cannot be stored. The admin API answers 400 for
// ErrInvalid and 413 for ErrTooLarge.
var (
	ErrInvalid  = errors.New("invalid grant")
	ErrTooLarge = errors.New("grant too large")
)

// Defaults of the limits a Store enforces.
const (
	DefaultMaxTTL       = 24 * time.Hour
	DefaultMaxValueSize = 64 << 10
	DefaultMaxGrants    = 256
	maxNameLen          = 128
)

// Option configures a Store's limits.
type Option func(*limitsConfig)

type limitsConfig struct {
	maxTTL       time.Duration
	maxValueSize int
	maxGrants    int
	timeout      time.Duration
}

// WithMaxTTL caps a grant's TTL (default 24h).
func WithMaxTTL(d time.Duration) Option { return func(c *limitsConfig) { c.maxTTL = d } }

// WithMaxValueSize caps the JSON encoding of a grant's value in bytes (default 64 KiB).
func WithMaxValueSize(n int) Option { return func(c *limitsConfig) { c.maxValueSize = n } }

// WithTimeout bounds each call of the Redis store (default 500ms; config redis.op_timeout).
func WithTimeout(d time.Duration) Option { return func(c *limitsConfig) { c.timeout = d } }

// WithMaxGrants caps the grants of one sandbox (default 256).
func WithMaxGrants(n int) Option { return func(c *limitsConfig) { c.maxGrants = n } }

func newLimitsConfig(opts []Option) limitsConfig {
	c := limitsConfig{maxTTL: DefaultMaxTTL, maxValueSize: DefaultMaxValueSize, maxGrants: DefaultMaxGrants, timeout: 500 * time.Millisecond}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// checkPut validates a Put and returns the value's JSON encoding.
func (c limitsConfig) checkPut(sandboxKey, name string, value any, ttl time.Duration) ([]byte, error) {
	if err := checkKey(sandboxKey); err != nil {
		return nil, err
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	switch {
	case ttl <= 0:
		return nil, fmt.Errorf("%w: ttl must be positive, got %s", ErrInvalid, ttl)
	case ttl > c.maxTTL:
		return nil, fmt.Errorf("%w: ttl %s is longer than the maximum of %s", ErrInvalid, ttl, c.maxTTL)
	}
	b, err := json.Marshal(value)
	if err != nil {
		return nil, fmt.Errorf("%w: value is not JSON: %v", ErrInvalid, err)
	}
	if len(b) > c.maxValueSize {
		return nil, fmt.Errorf("%w: value of grant %q is %d bytes, more than the maximum of %d", ErrTooLarge, name, len(b), c.maxValueSize)
	}
	return b, nil
}

func (c limitsConfig) tooMany(sandboxKey string) error {
	return fmt.Errorf("%w: sandbox %s already has the maximum of %d grants; delete some first", ErrTooLarge, sandboxKey, c.maxGrants)
}

// CheckName reports whether name can name a grant: 1 to 128 letters, digits, '-', '_' or '.'.
func CheckName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("%w: name must be 1 to %d characters, got %d", ErrInvalid, maxNameLen, len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("%w: name %q may contain only letters, digits, '-', '_' and '.'", ErrInvalid, name)
		}
	}
	return nil
}

func checkKey(sandboxKey string) error {
	if sandboxKey == "" {
		return fmt.Errorf("%w: empty sandbox key", ErrInvalid)
	}
	return nil
}

func decode(name string, b []byte) (any, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("decode grant %q: %w", name, err)
	}
	return v, nil
}
