package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
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
