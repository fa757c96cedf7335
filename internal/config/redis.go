package config

import "time"

// RedisAuditStream is the audit log's mirror in a Redis Stream.
type RedisAuditStream struct {
	// Enabled mirrors the audit log when redis.addr is set. Default true.
	Enabled *bool `json:"enabled"`
	// Name is the stream key. Default key_prefix + "audit".
	Name string `json:"name"`
	// MaxLen trims the stream to about this many entries (XADD MAXLEN ~). Default 1000000.
	MaxLen int64 `json:"max_len"`
}

// AuditStreamEnabled reports whether audit events are mirrored to a Redis Stream.
func (r Redis) AuditStreamEnabled() bool {
	return r.Addr != "" && (r.AuditStream.Enabled == nil || *r.AuditStream.Enabled)
}

func (r *Redis) applyDefaults() {
	if r.KeyPrefix == "" {
		r.KeyPrefix = "sandgate:"
	}
	if r.DialTimeout == 0 {
		r.DialTimeout = Duration(time.Second)
	}
	if r.OpTimeout == 0 {
		r.OpTimeout = Duration(250 * time.Millisecond)
	}
	if r.AuditStream.Name == "" {
		r.AuditStream.Name = r.KeyPrefix + "audit"
	}
	if r.AuditStream.MaxLen == 0 {
		r.AuditStream.MaxLen = 1_000_000
	}
}

func (r *Redis) validate(errs *fieldErrors) {
	if r.Addr != "" {
		validateHostPort(errs, "redis.addr", r.Addr, "redis:6379")
	}
	if r.DB < 0 {
		errs.add("redis.db", "must not be negative, got %d", r.DB)
	}
	if r.OpTimeout.D() > 10*time.Second {
		errs.add("redis.op_timeout", "%s is longer than 10s: a Redis outage would hold requests that long", r.OpTimeout.D())
	}
	if r.AuditStream.MaxLen < 0 {
		errs.add("redis.audit_stream.max_len", "must be positive, got %d", r.AuditStream.MaxLen)
	}
}
