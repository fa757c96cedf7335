package redisconn_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/breaker"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/test/redistest"
)

// setCalls is how many SET commands srv has executed (INFO commandstats).
func setCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_set:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// TestGuardSkipsRedisWhileOpen: with Redis hung (SIGSTOP) or gone (killed), the first call fails
// within about op_timeout and opens the breaker; the calls after it never reach Redis and fail at
// once; an answered readiness ping (unguarded) closes the breaker and calls go through again.
func TestGuardSkipsRedisWhileOpen(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const op = 200 * time.Millisecond
	for _, tc := range outages {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Redis{Addr: srv.Addr, DialTimeout: config.Duration(time.Second), OpTimeout: config.Duration(op)}
			c, err := redisconn.New(cfg, redisconn.Passwords{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			g, err := redisconn.NewGuard(c, config.RedisBreaker{Failures: 1, OpenFor: config.Duration(time.Hour)}, nil, nil)
			require.NoError(t, err)
			ctx := context.Background()
			require.NoError(t, c.Set(ctx, "k", "v", 0).Err(), "a working Redis answers through the guard")
			before := setCalls(t, admin)

			tc.outage(srv)
			start := time.Now()
			err = c.Set(ctx, "k", "v", 0).Err() // the client's op_timeout bounds it
			first := time.Since(start)
			require.ErrorIs(t, err, redisconn.ErrUnavailable)
			assert.Less(t, first, 4*op+time.Second, "the first failure costs about op_timeout")
			assert.Equal(t, breaker.Open, g.State())
			for range 50 {
				err := c.Set(ctx, "k", "v", 0).Err()
				require.ErrorIs(t, err, redisconn.ErrUnavailable)
				require.Contains(t, err.Error(), "breaker is open")
			}
			tc.recover(srv)
			if tc.hung {
				// The first SET may still sit in the socket; none of the 50 skipped calls was sent.
				assert.LessOrEqual(t, setCalls(t, admin), before+1)
			}
			assert.ErrorIs(t, c.Set(ctx, "k", "v", 0).Err(), redisconn.ErrUnavailable, "still open: nobody probed")
			require.Eventually(t, func() bool {
				return redisconn.Check(redisconn.Unguarded(ctx), c) == nil
			}, 20*time.Second, 50*time.Millisecond)
			assert.Equal(t, breaker.Closed, g.State(), "an answered readiness ping closes the breaker")
			assert.NoError(t, c.Set(ctx, "k", "v", 0).Err())
		})
	}
}

// TestGuardCountsOnlyOutages: answers of a working Redis (nil, error replies) never open the
// breaker, and a caller that gives up says nothing about Redis.
func TestGuardCountsOnlyOutages(t *testing.T) {
	srv := redistest.Start(t)
	c, err := redisconn.New(config.Redis{Addr: srv.Addr, DialTimeout: config.Duration(time.Second), OpTimeout: config.Duration(2 * time.Second)}, redisconn.Passwords{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	g, err := redisconn.NewGuard(c, config.RedisBreaker{Failures: 1, OpenFor: config.Duration(time.Hour)}, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()
	require.ErrorIs(t, c.Get(ctx, "missing").Err(), redis.Nil)
	require.NoError(t, c.Set(ctx, "s", "x", 0).Err())
	err = c.Incr(ctx, "s").Err()
	require.Error(t, err, "INCR of a string is an error reply")
	assert.False(t, errors.Is(err, redisconn.ErrUnavailable))
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.Error(t, c.Get(cancelled, "s").Err())
	assert.Equal(t, breaker.Closed, g.State())

	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "s")
		p.Get(ctx, "missing")
		return nil
	})
	assert.ErrorIs(t, err, redis.Nil, "a pipeline is observed like a command")
	assert.Equal(t, breaker.Closed, g.State())
}

// TestGuardProbes: once open_for has passed, one request-path call probes Redis: while Redis is
// still gone the probe fails (a real failure, not a skip) and the breaker opens again; once
// Redis is back a probe is answered and the breaker closes.
func TestGuardProbes(t *testing.T) {
	srv := redistest.Start(t)
	c, err := redisconn.New(config.Redis{Addr: srv.Addr, DialTimeout: config.Duration(time.Second), OpTimeout: config.Duration(200 * time.Millisecond)}, redisconn.Passwords{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	g, err := redisconn.NewGuard(c, config.RedisBreaker{Failures: 1, OpenFor: config.Duration(100 * time.Millisecond)}, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()
	srv.Stop()
	require.ErrorIs(t, c.Set(ctx, "k", "v", 0).Err(), redisconn.ErrUnavailable)
	require.Equal(t, breaker.Open, g.State())

	probed := func() bool { // polls until a call is let through to Redis
		err := c.Set(ctx, "k", "v", 0).Err()
		return err == nil || !strings.Contains(err.Error(), "breaker is open")
	}
	require.Eventually(t, probed, 20*time.Second, 10*time.Millisecond)
	assert.Equal(t, breaker.Open, g.State(), "a failed probe opens the breaker again")
	assert.Contains(t, c.Set(ctx, "k", "v", 0).Err().Error(), "breaker is open", "and the next call is skipped")

	srv.Restart()
	require.Eventually(t, func() bool { return c.Set(ctx, "k", "v", 0).Err() == nil }, 20*time.Second, 10*time.Millisecond,
		"a probe that needs a new connection gets through (its handshake is part of the call)")
	assert.Equal(t, breaker.Closed, g.State(), "an answered probe closes the breaker")
}
