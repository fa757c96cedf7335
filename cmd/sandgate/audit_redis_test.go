package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/test/redistest"
)

func TestAuditQueryRedis(t *testing.T) {
	srv := redistest.Start(t)
	dir := auditFixture(t)
	m, err := audit.NewStreamMirror(srv.Client(t), audit.StreamConfig{Dir: dir, Stream: "sg:audit", Timeout: 5 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, m.Sync(ctx))

	code, out, stderr := auditCLI(t, "query", "--redis", srv.Addr, "--redis-stream", "sg:audit", "--sandbox", "sb-1", "-o", "json")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, 2, strings.Count(out, "\n"), out)
	assert.Contains(t, out, `"sandbox":"sb-1"`)
	assert.NotContains(t, out, `"sandbox":"sb-2"`)

	code, _, stderr = auditCLI(t, "query", "--redis", srv.Addr, "--redis-stream", "sg:audit", "--decision", "maybe")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "decision")
}

// audit query --redis reads every replica's stream on a Redis Cluster and over TLS.
func TestAuditQueryRedisClusterAndTLS(t *testing.T) {
	mirrorTwice := func(t *testing.T, client redis.UniversalClient) {
		for _, source := range []string{"replica-a", "replica-b"} {
			m, err := audit.NewStreamMirror(client, audit.StreamConfig{Dir: auditFixture(t), Stream: "sg:audit", Source: source, Timeout: 5 * time.Second})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			require.NoError(t, m.Sync(ctx))
			cancel()
		}
	}
	t.Run("cluster", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		mirrorTwice(t, cluster.Client(t))
		code, out, stderr := auditCLI(t, "query", "--redis", strings.Join(cluster.Addrs[1:], ","), "--redis-cluster",
			"--redis-stream", "sg:audit", "--sandbox", "sb-1", "-o", "json")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, 4, strings.Count(out, "\n"), "sb-1's two events from each replica's log: %s", out)
	})
	t.Run("tls", func(t *testing.T) {
		srv, files := redistest.StartTLS(t)
		client, err := redisconn.New(config.Redis{Addr: srv.Addr, TLS: &config.RedisTLS{CAFile: files.CA},
			DialTimeout: config.Duration(2 * time.Second), OpTimeout: config.Duration(2 * time.Second)}, redisconn.Passwords{})
		require.NoError(t, err)
		defer client.Close()
		mirrorTwice(t, client)
		code, out, stderr := auditCLI(t, "query", "--redis", srv.Addr, "--redis-tls-ca-file", files.CA,
			"--redis-stream", "sg:audit", "--sandbox", "sb-1", "-o", "json")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, 4, strings.Count(out, "\n"), out)
		code, _, _ = auditCLI(t, "query", "--redis", srv.Addr, "--redis-stream", "sg:audit")
		assert.NotEqual(t, 0, code, "plain TCP to a TLS-only server fails")
	})
}
