package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/test/redistest"
)

// opTimeout is redis.op_timeout in the Redis scenarios.
const opTimeout = 500 * time.Millisecond

// takes is how many calls the limits counted for sandbox (the sum of its requests-per-minute
// counters in Redis): each counted call adds one.
func takes(t *testing.T, c *redis.Client, sandbox string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := c.Keys(ctx, "sandgate:limits:{sb:agents/"+sandbox+"}:rpm:*").Result()
	require.NoError(t, err)
	n := 0
	for _, k := range keys {
		v, err := c.Get(ctx, k).Int()
		require.NoError(t, err)
		n += v
	}
	return n
}

// TestRedisOutage: Redis hung (SIGSTOP) or killed under calls from two sandboxes. The first call
// of the outage pays at most about op_timeout (the breaker opens on its first failed Redis step
// and its later steps skip Redis); every later call skips Redis entirely (the breaker's skipped
// count grows by every call, and Redis's counters do not move); fail_open calls are answered and
// their events say limits "unavailable"; fail_closed ones are refused with
// limits_store_unavailable. When Redis is back the breaker closes and counting resumes. Events
// == answered requests throughout.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	up := startUpstream(t, "everything", 0)
	for _, tc := range []struct {
		name, mode      string
		outage, recover func(*redistest.Server)
		killed          bool
	}{
		{"redis hung, fail_open", "fail_open", (*redistest.Server).Pause, (*redistest.Server).Resume, false},
		{"redis killed, fail_open", "fail_open", (*redistest.Server).Stop, (*redistest.Server).Restart, true},
		{"redis hung, fail_closed", "fail_closed", (*redistest.Server).Pause, (*redistest.Server).Resume, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, admin.FlushAll(ctx).Err())
			g := startGate(t, upstreamsConfig(up.URL)+fmt.Sprintf(
				"redis: {addr: %q, op_timeout: %s, breaker: {open_for: 1m}}\nlimits: {failure_mode: %s}\n",
				srv.Addr, opTimeout, tc.mode))
			sandboxes := []*sandbox{g.connect(coder1), g.connect(coder2)}
			echo := func(i int) (bool, string) {
				ok, text, err := sandboxes[i%2].call("echo", map[string]any{"message": "m"})
				require.NoError(t, err)
				return ok, text
			}
			for i := range 4 {
				ok, text := echo(i)
				require.True(t, ok, text)
			}
			require.Equal(t, 2, takes(t, admin, "coder-1"), "calls are counted while Redis works")
			assert.Equal(t, 0.0, g.metric("sandgate_redis_breaker_state"))

			tc.outage(srv)
			start := time.Now()
			ok, text := echo(0)
			first := time.Since(start)
			assert.Equal(t, tc.mode == "fail_open", ok, text)
			assert.Equal(t, 1.0, g.metric("sandgate_redis_breaker_state"), "the first failure opens the breaker")
			if tc.mode == "fail_open" {
				assert.GreaterOrEqual(t, g.metric("sandgate_redis_breaker_skipped_total"), 1.0,
					"the first call's later Redis steps (grants, tool call slot) were skipped: it paid one op_timeout, not one per step")
			}
			assert.Less(t, first, 3*opTimeout, "the first call of the outage costs about op_timeout")

			const during = 20
			skippedBefore := g.metric("sandgate_redis_breaker_skipped_total")
			var latencies []time.Duration
			for i := range during {
				start := time.Now()
				ok, text := echo(i)
				latencies = append(latencies, time.Since(start))
				if tc.mode == "fail_open" {
					assert.True(t, ok, text)
				} else {
					assert.False(t, ok)
					assert.Contains(t, text, "rate limit store unavailable")
				}
			}
			skipped := g.metric("sandgate_redis_breaker_skipped_total") - skippedBefore
			assert.GreaterOrEqual(t, skipped, float64(during), "every call of the open breaker skipped Redis")
			slices.Sort(latencies)
			t.Logf("%s: first call %s (op_timeout %s); %d calls with the breaker open: p50 %s, max %s; Redis calls skipped %.0f",
				tc.name, first.Round(time.Millisecond), opTimeout, during, latencies[during/2].Round(time.Millisecond),
				latencies[during-1].Round(time.Millisecond), skipped)
			assert.Less(t, latencies[during/2], opTimeout, "with the breaker open a call does not wait for Redis")

			tc.recover(srv)
			before := 0
			if !tc.killed {
				before = 2
				// Only the first call's request may still have reached the hung server.
				assert.LessOrEqual(t, takes(t, admin, "coder-1"), before+1, "no call counted while the breaker was open")
				before = takes(t, admin, "coder-1")
			}
			g.eventually("redis healthy again in /readyz", func() bool {
				_, body := g.readyz()
				return !strings.Contains(fmt.Sprint(body["degraded"]), "redis:")
			})
			assert.Equal(t, 0.0, g.metric("sandgate_redis_breaker_state"), "an answered readiness ping closes the breaker")
			for i := range 4 {
				ok, text := echo(i)
				require.True(t, ok, text)
			}
			assert.Equal(t, before+2, takes(t, admin, "coder-1"), "counting resumes")

			evs := g.events()
			g.requireOneEventPerAnswer(evs)
			checkOutageEvents(t, evs, tc.mode, 1+during)
			warns := g.logLines("level=WARN")
			t.Logf("%s: %d WARN lines for %d calls of the outage:\n%s", tc.name, len(warns), 1+during, strings.Join(warns, "\n"))
			assert.Less(t, len(warns), 8, "Redis warnings are rate-limited, not one per call")
		})
	}
}

// checkOutageEvents: the tool calls of the outage (and only they) are admitted uncounted
// (fail_open) or refused for the limits store (fail_closed).
func checkOutageEvents(t *testing.T, evs []audit.Event, mode string, outageCalls int) {
	t.Helper()
	var uncounted, refused, calls int
	for _, ev := range evs {
		if ev.Kind != audit.KindToolsCall {
			assert.Empty(t, ev.Limits, "%s: %+v", ev.Kind, ev)
			continue
		}
		calls++
		if ev.Limits == audit.LimitsUnavailable {
			uncounted++
			assert.True(t, ev.Decision.Allow)
			assert.Equal(t, 200, ev.Outcome.Status)
		}
		if ev.Outcome.Error == "limits_store_unavailable" {
			refused++
			assert.Empty(t, ev.Limits, "a refused call was not admitted")
		}
	}
	assert.Equal(t, 4+outageCalls+4, calls)
	if mode == "fail_open" {
		assert.Equal(t, outageCalls, uncounted, "limits unavailable on exactly the calls of the outage")
		assert.Zero(t, refused)
	} else {
		assert.Equal(t, outageCalls, refused)
		assert.Zero(t, uncounted)
	}
}
