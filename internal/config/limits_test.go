package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestLimitsAndRedisErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc, wantErr string
	}{
		{"negative token budget of a template", "limits:\n  templates:\n    coding-agent:\n      tokens_per_day: -5\n",
			"limits.templates.coding-agent.tokens_per_day: must not be negative, got -5"},
		{"negative template total", "limits:\n  templates:\n    coding-agent:\n      total:\n        requests_per_minute: -1\n",
			"limits.templates.coding-agent.total.requests_per_minute: must not be negative"},
		{"negative default concurrency", "limits:\n  default:\n    concurrent_tool_calls: -2\n",
			"limits.default.concurrent_tool_calls: must not be negative"},
		{"unknown limit name", "limits:\n  templates:\n    coding-agent:\n      tokens_per_week: 5\n",
			`unknown field "limits.templates.coding-agent.tokens_per_week"`},
		{"template name with a space", "limits:\n  templates:\n    'coding agent':\n      tokens_per_day: 5\n",
			`limits.templates.coding agent: template name "coding agent" may contain only`},
		{"failure mode out of range", "limits:\n  failure_mode: maybe\n",
			`limits.failure_mode: "maybe" is not one of fail_closed, fail_open`},
		{"lease shorter than a second", "limits:\n  concurrency_lease: 10ms\n",
			"limits.concurrency_lease: 10ms is shorter than 1s"},
		{"redis address without port", "redis:\n  addr: redis\n", `redis.addr: "redis" is not host:port`},
		{"redis password names a missing credential", "redis:\n  addr: redis:6379\n  password_credential: nope\n",
			`redis.password_credential: no credential named "nope"`},
		{"redis op timeout that would hold requests", "redis:\n  op_timeout: 1m\n", "redis.op_timeout: 1m0s is longer than 10s"},
		{"negative breaker threshold", "redis:\n  breaker:\n    failures: -1\n", "redis.breaker.failures: must be positive"},
		{"breaker open for longer than a minute", "redis:\n  breaker:\n    open_for: 5m\n", "redis.breaker.open_for: must be between 0 and 1m, got 5m0s"},
		{"negative stream length", "redis:\n  audit_stream:\n    max_len: -1\n", "redis.audit_stream.max_len: must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestLimitsDefaultsAndLookup(t *testing.T) {
	doc := `
redis:
  addr: 127.0.0.1:6379
limits:
  default:
    requests_per_minute: 30
  templates:
    coding-agent:
      requests_per_minute: 120
      tokens_per_day: 100000
      concurrent_tool_calls: 4
      total:
        tokens_per_day: 5000000
`
	c, err := config.Parse([]byte(doc), "/etc/sandgate")
	require.NoError(t, err)

	assert.Equal(t, config.FailClosed, c.Limits.FailureMode, "budgets fail closed unless told otherwise")
	assert.Equal(t, 10*time.Minute, c.Limits.ConcurrencyLease.D())
	assert.Equal(t, 250*time.Millisecond, c.Redis.OpTimeout.D())
	assert.Equal(t, time.Second, c.Redis.DialTimeout.D())
	assert.Equal(t, 1, c.Redis.Breaker.Failures, "the first failure opens the breaker")
	assert.Equal(t, 2*time.Second, c.Redis.Breaker.OpenFor.D())
	assert.Equal(t, "sandgate:", c.Redis.KeyPrefix)
	assert.Equal(t, "sandgate:audit", c.Redis.AuditStream.Name)
	assert.Equal(t, int64(1_000_000), c.Redis.AuditStream.MaxLen)
	assert.True(t, c.Redis.AuditStreamEnabled())

	per, total := c.Limits.For("coding-agent")
	assert.Equal(t, config.LimitSet{RequestsPerMinute: 120, TokensPerDay: 100000, ConcurrentToolCalls: 4}, per)
	assert.Equal(t, config.LimitSet{TokensPerDay: 5000000}, total)

	per, total = c.Limits.For("unlisted")
	assert.Equal(t, config.LimitSet{RequestsPerMinute: 30}, per, "a template without an entry gets the default")
	assert.True(t, total.IsZero())
}

func TestAuditStreamNeedsRedis(t *testing.T) {
	c, err := config.Parse([]byte("limits:\n  failure_mode: fail_open\n"), "/")
	require.NoError(t, err)
	assert.False(t, c.Redis.AuditStreamEnabled(), "no redis.addr: nothing to mirror to")
	assert.Equal(t, config.FailOpen, c.Limits.FailureMode)
}
