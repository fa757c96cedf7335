package config

import (
	"fmt"
	"time"
)

// RedisSentinel finds the Redis primary through Sentinel.
type RedisSentinel struct {
	// MasterName is the name the sentinels monitor the primary under.
	MasterName string `json:"master_name"`
	// Addrs are the sentinels, host:port each (26379 is Sentinel's usual port).
	Addrs []string `json:"addrs"`
	// PasswordCredential names a credential holding the sentinels' own password, when they have
	// one (redis.password_credential is the data nodes').
	PasswordCredential string `json:"password_credential"`
}

// RedisCluster is a Redis Cluster.
type RedisCluster struct {
	// Addrs are seed nodes, host:port each; the client learns the others from them.
	Addrs []string `json:"addrs"`
}

// RedisTLS connects to Redis (every node, and the sentinels) with TLS. Paths are relative to the
// config file's folder.
type RedisTLS = ClientTLS

// RedisBreaker is the circuit breaker in front of Redis.
type RedisBreaker struct {
	// Failures is how many request-path Redis calls in a row must fail (no answer within
	// op_timeout, connection refused) to open the breaker. Default 1: the first timeout already
	// tells that Redis is gone, and each further try would cost a caller op_timeout.
	Failures int `json:"failures"`
	// OpenFor is how long the open breaker skips Redis before one call probes it again
	// (default 2s). Limits then apply their failure mode without asking Redis.
	OpenFor Duration `json:"open_for"`
}

// RedisAuditStream is the audit log's mirror in a Redis Stream.
type RedisAuditStream struct {
	// Enabled mirrors the audit log when Redis is configured. Default true.
	Enabled *bool `json:"enabled"`
	// Name is the stream key. Default key_prefix + "audit".
	Name string `json:"name"`
	// MaxLen trims the stream to about this many entries (XADD MAXLEN ~). Default 1000000.
	MaxLen int64 `json:"max_len"`
}

// Enabled reports whether a Redis topology is configured (else the shared state stays in memory).
func (r Redis) Enabled() bool { return r.Addr != "" || r.Sentinel != nil || r.Cluster != nil }

// Topology names the configured topology for logs: "single", "sentinel", "cluster" or "".
func (r Redis) Topology() string {
	switch {
	case r.Sentinel != nil:
		return "sentinel"
	case r.Cluster != nil:
		return "cluster"
	case r.Addr != "":
		return "single"
	}
	return ""
}

// AuditStreamEnabled reports whether audit events are mirrored to a Redis Stream.
func (r Redis) AuditStreamEnabled() bool {
	return r.Enabled() && (r.AuditStream.Enabled == nil || *r.AuditStream.Enabled)
}

func (r *Redis) applyDefaults(c *Config) {
	if r.KeyPrefix == "" {
		r.KeyPrefix = "sandgate:"
	}
	if r.DialTimeout == 0 {
		r.DialTimeout = Duration(time.Second)
	}
	if r.OpTimeout == 0 {
		r.OpTimeout = Duration(250 * time.Millisecond)
	}
	if r.Breaker.Failures == 0 {
		r.Breaker.Failures = 1
	}
	if r.Breaker.OpenFor == 0 {
		r.Breaker.OpenFor = Duration(2 * time.Second)
	}
	if r.AuditStream.Name == "" {
		r.AuditStream.Name = r.KeyPrefix + "audit"
	}
	if r.AuditStream.MaxLen == 0 {
		r.AuditStream.MaxLen = 1_000_000
	}
	r.TLS.resolve(c)
}

func (r *Redis) validate(c *Config, errs *fieldErrors) {
	r.validateTopology(errs)
	if r.DB < 0 {
		errs.add("redis.db", "must not be negative, got %d", r.DB)
	}
	if r.DB != 0 && r.Cluster != nil {
		errs.add("redis.db", "a Redis Cluster has only database 0, got %d", r.DB)
	}
	if r.OpTimeout.D() > 10*time.Second {
		errs.add("redis.op_timeout", "%s is longer than 10s: a Redis outage would hold requests that long", r.OpTimeout.D())
	}
	if r.Breaker.Failures < 0 {
		errs.add("redis.breaker.failures", "must be positive, got %d", r.Breaker.Failures)
	}
	if d := r.Breaker.OpenFor.D(); d < 0 || d > time.Minute {
		errs.add("redis.breaker.open_for", "must be between 0 and 1m, got %s", d)
	}
	if r.AuditStream.MaxLen < 0 {
		errs.add("redis.audit_stream.max_len", "must be positive, got %d", r.AuditStream.MaxLen)
	}
	if r.Username != "" && r.PasswordCredential == "" {
		errs.add("redis.username", "an ACL user needs its password: set redis.password_credential too")
	}
	for _, ref := range [][2]string{
		{"redis.password_credential", r.PasswordCredential},
		{"redis.sentinel.password_credential", sentinelPassword(r.Sentinel)},
	} {
		if ref[1] != "" && !c.HasCredential(ref[1]) {
			errs.add(ref[0], "no credential named %q in credentials", ref[1])
		}
	}
	if r.TLS != nil && !r.Enabled() {
		errs.add("redis.tls", "set redis.addr, redis.sentinel or redis.cluster too")
	}
	r.TLS.validate("redis.tls", errs)
}

// validateTopology checks that at most one topology is set, and its addresses.
func (r *Redis) validateTopology(errs *fieldErrors) {
	n := 0
	for _, set := range []bool{r.Addr != "", r.Sentinel != nil, r.Cluster != nil} {
		if set {
			n++
		}
	}
	if n > 1 {
		errs.add("redis", "set exactly one of redis.addr, redis.sentinel and redis.cluster, not %d", n)
	}
	if r.Addr != "" {
		validateHostPort(errs, "redis.addr", r.Addr, "redis:6379")
	}
	if s := r.Sentinel; s != nil {
		if s.MasterName == "" {
			errs.add("redis.sentinel.master_name", "must not be empty (the name the sentinels monitor the primary under, often mymaster)")
		}
		validateAddrs(errs, "redis.sentinel.addrs", s.Addrs, "redis-sentinel:26379")
	}
	if cl := r.Cluster; cl != nil {
		validateAddrs(errs, "redis.cluster.addrs", cl.Addrs, "redis-cluster:6379")
	}
}

func validateAddrs(errs *fieldErrors, field string, addrs []string, example string) {
	if len(addrs) == 0 {
		errs.add(field, "must list at least one host:port (for example [%s])", example)
	}
	for i, a := range addrs {
		validateHostPort(errs, fmt.Sprintf("%s[%d]", field, i), a, example)
	}
}

func sentinelPassword(s *RedisSentinel) string {
	if s == nil {
		return ""
	}
	return s.PasswordCredential
}
