package redisconn_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/test/redistest"
)

func TestClientCallsAreBoundedByOpTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c := redisconn.New(config.Redis{
		Addr:        srv.Addr,
		DialTimeout: config.Duration(time.Second),
		OpTimeout:   config.Duration(200 * time.Millisecond),
	}, "")
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool { return redisconn.Check(ctx, c) == nil }, 10*time.Second, 50*time.Millisecond)

	for _, tc := range []struct {
		name            string
		outage, recover func(*redistest.Server)
	}{
		{"a hung server", (*redistest.Server).Pause, (*redistest.Server).Resume},
		{"a stopped server", (*redistest.Server).Stop, (*redistest.Server).Restart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.outage(srv)
			start := time.Now()
			err := c.Set(ctx, "k", "v", 0).Err() // no deadline of its own: op_timeout bounds it
			assert.Error(t, err)
			assert.Less(t, time.Since(start), 3*time.Second)
			tc.recover(srv)
			assert.Eventually(t, func() bool { return redisconn.Check(ctx, c) == nil }, 10*time.Second, 50*time.Millisecond)
		})
	}
}
