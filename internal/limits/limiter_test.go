package limits_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/limits"
	"github.com/sandgate/sandgate/test/redistest"
)

// clock is a settable clock shared by the limiters of one test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 14, 23, 58, 10, 0, time.UTC)} }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// backend makes limiters over one counter store: every limiter a backend returns sees the same
// counters (for Redis: a fresh key prefix on a shared server, one client per limiter).
type backend struct {
	name string
	make func(t *testing.T) func(cfg config.Limits, opts ...limits.Option) *limits.Limiter
}

func backends(t *testing.T) []backend {
	srv := redistest.Start(t) // owned by the parent test, shared by its subtests
	cluster := redistest.StartCluster(t, 3)
	var seq atomic.Int64
	return []backend{
		{"memory", func(*testing.T) func(config.Limits, ...limits.Option) *limits.Limiter {
			var shared *limits.Limiter
			return func(cfg config.Limits, opts ...limits.Option) *limits.Limiter {
				if shared == nil {
					shared = limits.NewMemory(cfg, opts...)
				}
				return shared
			}
		}},
		{"redis", func(t *testing.T) func(config.Limits, ...limits.Option) *limits.Limiter {
			prefix := fmt.Sprintf("test%d:", seq.Add(1))
			return func(cfg config.Limits, opts ...limits.Option) *limits.Limiter {
				opts = append([]limits.Option{limits.WithTimeout(5 * time.Second)}, opts...)
				return limits.NewRedis(srv.Client(t), prefix, cfg, opts...)
			}
		}},
		{"redis cluster", func(t *testing.T) func(config.Limits, ...limits.Option) *limits.Limiter {
			prefix := fmt.Sprintf("test%d:", seq.Add(1))
			return func(cfg config.Limits, opts ...limits.Option) *limits.Limiter {
				opts = append([]limits.Option{limits.WithTimeout(5 * time.Second)}, opts...)
				return limits.NewRedis(cluster.Client(t), prefix, cfg, opts...)
			}
		}},
	}
}

var (
	alice = limits.Keys{Sandbox: "team-a/alice", Template: "coding-agent"}
	bob   = limits.Keys{Sandbox: "team-a/bob", Template: "coding-agent"}
	stray = limits.Keys{Sandbox: "team-b/stray", Template: "unlisted"}
)

func testLimits() config.Limits {
	return config.Limits{
		FailureMode:      config.FailClosed,
		ConcurrencyLease: config.Duration(time.Minute),
		Default:          config.LimitSet{RequestsPerMinute: 1},
		Templates: map[string]config.TemplateLimits{
			"coding-agent": {
				LimitSet: config.LimitSet{RequestsPerMinute: 3, TokensPerDay: 1000, ConcurrentToolCalls: 2},
				Total:    config.LimitSet{TokensPerDay: 1500, RequestsPerMinute: 5},
			},
		},
	}
}

func TestLimiterBehaviour(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(t *testing.T, l *limits.Limiter, clk *clock)
	}{
		{"requests beyond the per-minute limit are refused with a reason naming the sandbox and template", func(t *testing.T, l *limits.Limiter, clk *clock) {
			for i := 1; i <= 3; i++ {
				u, v, err := l.Take(ctx, alice)
				require.NoError(t, err)
				require.True(t, v.Allowed, "request %d", i)
				assert.Equal(t, int64(i), u[limits.UsageRequestsThisMinute])
			}
			u, v, err := l.Take(ctx, alice)
			require.NoError(t, err)
			assert.False(t, v.Allowed)
			assert.Equal(t, limits.CodeRateLimited, v.Code)
			assert.Equal(t, "rate limit of 3 requests/minute for sandbox team-a/alice (template coding-agent) is reached", v.Reason)
			assert.Equal(t, 50*time.Second, v.RetryAfter)
			assert.Equal(t, int64(3), u[limits.UsageRequestsThisMinute], "a refused request does not count")
		}},
		{"the next minute starts a fresh window", func(t *testing.T, l *limits.Limiter, clk *clock) {
			for range 3 {
				_, _, _ = l.Take(ctx, alice)
			}
			clk.Add(time.Minute)
			u, v, err := l.Take(ctx, alice)
			require.NoError(t, err)
			assert.True(t, v.Allowed)
			assert.Equal(t, int64(1), u[limits.UsageRequestsThisMinute])
		}},
		{"sandboxes of one template have their own counters", func(t *testing.T, l *limits.Limiter, clk *clock) {
			for range 3 {
				_, _, _ = l.Take(ctx, alice)
			}
			_, v, err := l.Take(ctx, bob)
			require.NoError(t, err)
			assert.True(t, v.Allowed)
		}},
		{"the template total is shared by all its sandboxes", func(t *testing.T, l *limits.Limiter, clk *clock) {
			for range 3 {
				_, _, _ = l.Take(ctx, alice)
			}
			for range 2 {
				_, v, _ := l.Take(ctx, bob)
				require.True(t, v.Allowed)
			}
			u, v, err := l.Take(ctx, bob)
			require.NoError(t, err)
			assert.False(t, v.Allowed)
			assert.Equal(t, "rate limit of 5 requests/minute for template coding-agent (all its sandboxes together) is reached", v.Reason)
			assert.Equal(t, int64(5), u[limits.UsageTemplateRequestsThisMinute])
			assert.Equal(t, int64(2), u[limits.UsageRequestsThisMinute], "a call its template refused is not charged to the sandbox")
			u, err = l.Usage(ctx, bob)
			require.NoError(t, err)
			assert.Equal(t, int64(2), u[limits.UsageRequestsThisMinute])
		}},
		{"a template without an entry gets the default limits", func(t *testing.T, l *limits.Limiter, clk *clock) {
			_, v, _ := l.Take(ctx, stray)
			require.True(t, v.Allowed)
			u, v, _ := l.Take(ctx, stray)
			assert.False(t, v.Allowed)
			assert.Contains(t, v.Reason, "rate limit of 1 requests/minute for sandbox team-b/stray")
			assert.NotContains(t, u, limits.UsageTemplateRequestsThisMinute, "no template total configured")
		}},
		{"tokens are counted and a spent budget refuses the next request until UTC midnight", func(t *testing.T, l *limits.Limiter, clk *clock) {
			v, err := l.AddTokens(ctx, alice, 999)
			require.NoError(t, err)
			assert.True(t, v.Allowed)
			assert.Equal(t, int64(999), usageOf(t, l, alice)[limits.UsageTokensToday])
			v, err = l.AddTokens(ctx, alice, 1)
			require.NoError(t, err)
			assert.False(t, v.Allowed, "a stream reaching the budget is told to stop")
			assert.Equal(t, limits.CodeTokenBudgetSpent, v.Code)
			assert.Equal(t, int64(1000), usageOf(t, l, alice)[limits.UsageTokensToday])

			_, v, err = l.Take(ctx, alice)
			require.NoError(t, err)
			assert.False(t, v.Allowed)
			assert.Equal(t, "token budget of 1000/day for sandbox team-a/alice (template coding-agent) is spent", v.Reason)
			assert.Equal(t, time.Minute+50*time.Second, v.RetryAfter)

			clk.Add(2 * time.Minute) // 00:00:10 UTC the next day
			u, v, err := l.Take(ctx, alice)
			require.NoError(t, err)
			assert.True(t, v.Allowed, "a new UTC day restores the budget")
			assert.Zero(t, u[limits.UsageTokensToday])
		}},
		{"tokens used past the budget are still counted", func(t *testing.T, l *limits.Limiter, clk *clock) {
			_, _ = l.AddTokens(ctx, alice, 1200)
			v, err := l.AddTokens(ctx, alice, 10)
			require.NoError(t, err)
			assert.False(t, v.Allowed)
			assert.Equal(t, int64(1210), usageOf(t, l, alice)[limits.UsageTokensToday])
		}},
		{"the template token total refuses a sandbox that has budget left", func(t *testing.T, l *limits.Limiter, clk *clock) {
			_, _ = l.AddTokens(ctx, alice, 900)
			v, err := l.AddTokens(ctx, bob, 600)
			require.NoError(t, err)
			u := usageOf(t, l, bob)
			assert.False(t, v.Allowed)
			assert.Equal(t, "token budget of 1500/day for template coding-agent (all its sandboxes together) is spent", v.Reason)
			assert.Equal(t, int64(600), u[limits.UsageTokensToday])
			assert.Equal(t, int64(1500), u[limits.UsageTemplateTokensToday])
		}},
		{"negative tokens are an error", func(t *testing.T, l *limits.Limiter, clk *clock) {
			_, err := l.AddTokens(ctx, alice, -1)
			assert.Error(t, err)
		}},
		{"concurrent tool calls beyond the limit are refused until one is released", func(t *testing.T, l *limits.Limiter, clk *clock) {
			r1, v, err := l.Acquire(ctx, alice)
			require.NoError(t, err)
			require.True(t, v.Allowed)
			assert.Equal(t, int64(1), usageOf(t, l, alice)[limits.UsageConcurrentToolCalls])
			r2, v, _ := l.Acquire(ctx, alice)
			require.True(t, v.Allowed)
			r3, v, err := l.Acquire(ctx, alice)
			require.NoError(t, err)
			assert.False(t, v.Allowed)
			assert.Equal(t, limits.CodeConcurrency, v.Code)
			assert.Equal(t, "limit of 2 concurrent tool calls for sandbox team-a/alice (template coding-agent) is reached", v.Reason)
			r3() // a refused acquire's release is a harmless no-op
			r1()
			r1() // release is idempotent: it must not free r2's slot
			_, v, _ = l.Acquire(ctx, alice)
			assert.True(t, v.Allowed)
			assert.Equal(t, int64(2), usageOf(t, l, alice)[limits.UsageConcurrentToolCalls])
			r2()
		}},
		{"a slot that is never released comes back when its lease expires", func(t *testing.T, l *limits.Limiter, clk *clock) {
			_, _, _ = l.Acquire(ctx, alice)
			_, _, _ = l.Acquire(ctx, alice)
			clk.Add(time.Minute + time.Second)
			_, v, err := l.Acquire(ctx, alice)
			require.NoError(t, err)
			assert.True(t, v.Allowed)
			assert.Equal(t, int64(1), usageOf(t, l, alice)[limits.UsageConcurrentToolCalls])
		}},
		{"usage reads the counters without counting", func(t *testing.T, l *limits.Limiter, clk *clock) {
			_, _, _ = l.Take(ctx, alice)
			_, _ = l.AddTokens(ctx, alice, 42)
			release, _, _ := l.Acquire(ctx, alice)
			defer release()
			for range 2 {
				u, err := l.Usage(ctx, alice)
				require.NoError(t, err)
				assert.Equal(t, limits.Usage{
					limits.UsageRequestsThisMinute: 1, limits.UsageTokensToday: 42, limits.UsageConcurrentToolCalls: 1,
					limits.UsageTemplateRequestsThisMinute: 1, limits.UsageTemplateTokensToday: 42, limits.UsageTemplateConcurrentToolCalls: 1,
				}, u)
			}
		}},
		{"a reload applies at once to callers already counted in the minute", func(t *testing.T, l *limits.Limiter, clk *clock) {
			for range 3 {
				_, v, _ := l.Take(ctx, alice)
				require.True(t, v.Allowed)
			}
			_, v, _ := l.Take(ctx, alice)
			require.False(t, v.Allowed, "alice's 3/minute is reached")
			cfg := testLimits()
			tpl := cfg.Templates["coding-agent"]
			tpl.RequestsPerMinute = 4
			cfg.Templates["coding-agent"] = tpl
			l.SetLimits(cfg)
			u, v, _ := l.Take(ctx, alice)
			assert.True(t, v.Allowed, "the raised limit holds for alice's counters: %s", v.Reason)
			assert.Equal(t, int64(4), u[limits.UsageRequestsThisMinute], "the counters were kept")
			_, v, _ = l.Take(ctx, alice)
			assert.Contains(t, v.Reason, "rate limit of 4 requests/minute")
		}},
		{"unlimited sandboxes are still counted for the policy", func(t *testing.T, l *limits.Limiter, clk *clock) {
			l.SetLimits(config.Limits{})
			for range 10 {
				_, v, _ := l.Take(ctx, stray)
				require.True(t, v.Allowed)
			}
			u, err := l.Usage(ctx, stray)
			require.NoError(t, err)
			assert.Equal(t, int64(10), u[limits.UsageRequestsThisMinute])
		}},
	}
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					clk := newClock()
					l := b.make(t)(testLimits(), limits.WithClock(clk.Now))
					tc.run(t, l, clk)
				})
			}
		})
	}
}

func TestConcurrentTakesCountExactly(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			const workers, each, limit = 16, 25, 250
			cfg := config.Limits{Default: config.LimitSet{RequestsPerMinute: limit}}
			clk := newClock()
			newLimiter := b.make(t)
			// Four limiters over one store: for Redis, four replicas with their own connections.
			ls := []*limits.Limiter{}
			for range 4 {
				ls = append(ls, newLimiter(cfg, limits.WithClock(clk.Now)))
			}
			var ok, refused atomic.Int64
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					l := ls[w%len(ls)]
					for range each {
						_, v, err := l.Take(context.Background(), stray)
						if err != nil {
							t.Error(err)
							return
						}
						if v.Allowed {
							ok.Add(1)
						} else {
							refused.Add(1)
						}
					}
				})
			}
			wg.Wait()
			assert.Equal(t, int64(limit), ok.Load(), "exactly the limit is allowed")
			assert.Equal(t, int64(workers*each-limit), refused.Load())
		})
	}
}

// The limiter keeps each caller's counter keys for a minute and a config: callers arriving
// together, a config reload among them and the next minute must neither lose a count nor charge
// one to a stale window.
func TestConcurrentCallersAcrossReloadsAndMinutes(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			const sandboxes, workers, each = 8, 4, 20
			cfg := roomyLimits()
			clk := newClock()
			l := b.make(t)(cfg, limits.WithClock(clk.Now))
			keys := make([]limits.Keys, sandboxes)
			for i := range keys {
				keys[i] = limits.Keys{Sandbox: fmt.Sprintf("team-a/s%d", i), Template: "coding-agent"}
			}
			round := func() {
				var wg sync.WaitGroup
				for w := range sandboxes * workers {
					wg.Go(func() {
						for j := range each {
							if w == 0 && j == each/2 {
								l.SetLimits(roomyLimits()) // a reload mid-round: counters are kept
							}
							if _, v, err := l.Take(context.Background(), keys[w%sandboxes]); err != nil || !v.Allowed {
								t.Error(v, err)
								return
							}
						}
					})
				}
				wg.Wait()
			}
			for range 2 {
				round()
				for _, k := range keys {
					u := usageOf(t, l, k)
					assert.Equal(t, int64(workers*each), u[limits.UsageRequestsThisMinute], k.Sandbox)
					assert.Equal(t, int64(sandboxes*workers*each), u[limits.UsageTemplateRequestsThisMinute], k.Sandbox)
				}
				clk.Add(time.Minute) // the next round counts in a fresh window
			}
		})
	}
}

func TestReplicasShareOneBudget(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testLimits()
	clk := newClock()
	replicaA := limits.NewRedis(srv.Client(t), "shared:", cfg, limits.WithClock(clk.Now), limits.WithTimeout(5*time.Second))
	replicaB := limits.NewRedis(srv.Client(t), "shared:", cfg, limits.WithClock(clk.Now), limits.WithTimeout(5*time.Second))
	ctx := context.Background()

	v, err := replicaA.AddTokens(ctx, alice, 600)
	require.NoError(t, err)
	require.True(t, v.Allowed)
	v, err = replicaB.AddTokens(ctx, alice, 400)
	require.NoError(t, err)
	assert.False(t, v.Allowed, "replica B sees the tokens counted by replica A")
	assert.Equal(t, int64(1000), usageOf(t, replicaB, alice)[limits.UsageTokensToday])
	_, v, _ = replicaA.Take(ctx, alice)
	assert.False(t, v.Allowed)
	assert.Equal(t, limits.CodeTokenBudgetSpent, v.Code)

	release, v, _ := replicaA.Acquire(ctx, bob)
	require.True(t, v.Allowed)
	_, v, _ = replicaB.Acquire(ctx, bob)
	require.True(t, v.Allowed)
	_, v, _ = replicaB.Acquire(ctx, bob)
	assert.False(t, v.Allowed, "two slots taken across replicas")
	release()
	_, v, _ = replicaB.Acquire(ctx, bob)
	assert.True(t, v.Allowed, "a slot released on replica A is free on replica B")
}

func TestRedisOutage(t *testing.T) {
	const opTimeout = 250 * time.Millisecond
	const bound = 3 * time.Second // opTimeout plus scheduling slack on a loaded machine
	cases := []struct {
		name        string
		mode        string
		outage      func(*redistest.Server)
		recover     func(*redistest.Server)
		wantAllowed bool
	}{
		{"stopped Redis fails closed by default", config.FailClosed, (*redistest.Server).Stop, (*redistest.Server).Restart, false},
		{"stopped Redis fails open when configured", config.FailOpen, (*redistest.Server).Stop, (*redistest.Server).Restart, true},
		{"hung Redis fails closed within the deadline", config.FailClosed, (*redistest.Server).Pause, (*redistest.Server).Resume, false},
		{"hung Redis fails open within the deadline when configured", config.FailOpen, (*redistest.Server).Pause, (*redistest.Server).Resume, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := testLimits()
			cfg.FailureMode = tc.mode
			l := limits.NewRedis(srv.Client(t), "outage:", cfg, limits.WithTimeout(opTimeout))
			ctx := context.Background()
			require.Eventually(t, func() bool { _, v, err := l.Take(ctx, alice); return err == nil && v.Allowed },
				10*time.Second, 50*time.Millisecond, "works before the outage")

			tc.outage(srv)
			for _, op := range []struct {
				name string
				call func() (limits.Verdict, error)
			}{
				{"take", func() (limits.Verdict, error) { _, v, err := l.Take(ctx, alice); return v, err }},
				{"add tokens", func() (limits.Verdict, error) { return l.AddTokens(ctx, alice, 5) }},
				{"acquire", func() (limits.Verdict, error) {
					release, v, err := l.Acquire(ctx, alice)
					start := time.Now()
					release()
					assert.Less(t, time.Since(start), bound, "release is bounded too")
					return v, err
				}},
			} {
				start := time.Now()
				v, err := op.call()
				took := time.Since(start)
				assert.Error(t, err, op.name)
				assert.Less(t, took, bound, "%s returned after %s", op.name, took)
				assert.Equal(t, tc.wantAllowed, v.Allowed, op.name)
				if !tc.wantAllowed {
					assert.Equal(t, limits.ReasonStoreUnavailable, v.Reason)
					assert.Equal(t, limits.CodeStoreUnavailable, v.Code)
				}
			}
			_, err := l.Usage(ctx, alice)
			assert.Error(t, err)

			tc.recover(srv)
			require.Eventually(t, func() bool { _, v, err := l.Take(ctx, alice); return err == nil && v.Allowed },
				10*time.Second, 50*time.Millisecond, "works again after the outage")
		})
	}
}

func TestReasonsAreSentences(t *testing.T) {
	l := limits.NewMemory(config.Limits{Default: config.LimitSet{TokensPerDay: 10}})
	v, _ := l.AddTokens(context.Background(), limits.Keys{Sandbox: "anonymous"}, 10)
	assert.Equal(t, "token budget of 10/day for sandbox anonymous is spent", v.Reason)
	assert.False(t, strings.HasSuffix(v.Reason, "."))
}

func TestClusterSpreadsSandboxesOverItsShards(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	l := limits.NewRedis(client, "spread:", testLimits(), limits.WithTimeout(5*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 30 {
		_, v, err := l.Take(ctx, limits.Keys{Sandbox: fmt.Sprintf("team-a/s%d", i), Template: "coding-agent"})
		require.NoError(t, err, "every script's keys sit in one slot")
		require.Equal(t, i < 5, v.Allowed, "the template total of 5/minute holds across shards")
	}
	var shards atomic.Int64 // ForEachMaster calls fn on every primary at once
	require.NoError(t, client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, "spread:limits:{sb:*").Result()
		if len(keys) > 0 {
			shards.Add(1)
		}
		return err
	}))
	assert.Equal(t, int64(3), shards.Load(), "the sandboxes' counters are on every primary")
}

// usageOf reads k's counters (Limiter.Usage).
func usageOf(t *testing.T, l *limits.Limiter, k limits.Keys) limits.Usage {
	t.Helper()
	u, err := l.Usage(context.Background(), k)
	require.NoError(t, err)
	return u
}
