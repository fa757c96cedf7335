package admission

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/limits"
	"github.com/sandgate/sandgate/policy"
)

func TestAdmit(t *testing.T) {
	coder := identity.Identity{Namespace: "agents", Sandbox: "coder-1", Template: "coding-agent", Known: true}
	g := grants.NewMemory()
	require.NoError(t, g.Put(context.Background(), coder.Key(), "github_repos", []any{"acme/api"}, time.Hour))
	noon := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC) // one window for every case
	a, err := New(limits.NewMemory(config.Limits{Default: config.LimitSet{RequestsPerMinute: 2, ConcurrentToolCalls: 1}},
		limits.WithClock(func() time.Time { return noon })), g, nil, nil)
	require.NoError(t, err)

	tests := []struct {
		name       string
		adm        *Admission
		id         identity.Identity
		wantDeny   string // code; "" admits
		wantGrants bool
		wantUsage  int64 // requests_this_minute
	}{
		{"a nil admission admits and adds nothing", nil, coder, "", false, 0},
		{"the first call is counted and sees the sandbox's grants", a, coder, "", true, 1},
		{"the second call is counted", a, coder, "", true, 2},
		{"a call over requests_per_minute is refused with the limiter's code", a, coder, string(limits.CodeRateLimited), false, 0},
		{"an unknown caller is neither counted nor given grants", a, identity.Identity{}, "", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &policy.Input{Kind: audit.KindToolsCall, Identity: tt.id}
			deny := tt.adm.Admit(context.Background(), in)
			if tt.wantDeny != "" {
				require.NotNil(t, deny)
				assert.Equal(t, tt.wantDeny, string(deny.Code))
				assert.Contains(t, deny.Reason, "agents/coder-1")
				return
			}
			require.Nil(t, deny)
			assert.Equal(t, tt.wantGrants, in.Grants["github_repos"] != nil)
			assert.Equal(t, tt.wantUsage, in.Usage[limits.UsageRequestsThisMinute])
		})
	}

	t.Run("a second concurrent tool call is refused until the first releases its slot", func(t *testing.T) {
		release, deny := a.AcquireToolCall(context.Background(), coder)
		require.Nil(t, deny)
		_, deny = a.AcquireToolCall(context.Background(), coder)
		require.NotNil(t, deny)
		assert.Equal(t, limits.CodeConcurrency, deny.Code)
		release()
		release2, deny := a.AcquireToolCall(context.Background(), coder)
		assert.Nil(t, deny)
		release2()
	})
}

// TestAdmitClaimGrants: a dispatcher registers grants by the claim it created; the sandbox the
// claim is bound to (whatever its name, a warm pool's included) sees them, with its own grants
// over them, and no other sandbox does.
func TestAdmitClaimGrants(t *testing.T) {
	ctx := context.Background()
	g := grants.NewMemory()
	require.NoError(t, g.Put(ctx, grants.ClaimKey("agents", "task-2"), "github_repos", []any{"acme/api"}, time.Hour))
	require.NoError(t, g.Put(ctx, grants.ClaimKey("agents", "task-2"), "mode", "claim", time.Hour))
	require.NoError(t, g.Put(ctx, "agents/wp-coding-x7k2q", "mode", "sandbox", time.Hour))
	a, err := New(nil, g, nil, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		id   identity.Identity
		want map[string]any
	}{
		{"the claim's sandbox, named after the warm pool, sees the claim's grants under its own",
			identity.Identity{Namespace: "agents", Sandbox: "wp-coding-x7k2q", Claim: "task-2", Known: true},
			map[string]any{"github_repos": []any{"acme/api"}, "mode": "sandbox"}},
		{"a sandbox of another claim sees none of them",
			identity.Identity{Namespace: "agents", Sandbox: "task-3", Claim: "task-3", Known: true}, map[string]any{}},
		{"a claim of the same name in another namespace is another claim",
			identity.Identity{Namespace: "other", Sandbox: "x", Claim: "task-2", Known: true}, map[string]any{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &policy.Input{Kind: audit.KindToolsCall, Identity: tc.id}
			require.Nil(t, a.Admit(ctx, in))
			assert.Equal(t, tc.want, in.Grants)
		})
	}
}

// TestUncountedCallsAreMarked: a call the limits could not count but let through (fail_open)
// is marked in its Counting, so its event says limits "unavailable"; a counted call, and one
// refused fail_closed, are not.
func TestUncountedCallsAreMarked(t *testing.T) {
	coder := identity.Identity{Namespace: "agents", Sandbox: "coder-1", Template: "coding-agent", Known: true}
	// Nothing listens on port 1 of loopback: every Redis call fails at once.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = down.Close() })
	set := config.LimitSet{RequestsPerMinute: 10, ConcurrentToolCalls: 2}
	for _, tc := range []struct {
		name          string
		limits        *limits.Limiter
		wantRefused   bool
		wantUncounted bool
	}{
		{"counted in memory", limits.NewMemory(config.Limits{Default: set}), false, false},
		{"store down, fail_open: admitted uncounted", limits.NewRedis(down, "t:", config.Limits{Default: set, FailureMode: config.FailOpen}), false, true},
		{"store down, fail_closed: refused", limits.NewRedis(down, "t:", config.Limits{Default: set, FailureMode: config.FailClosed}), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.limits, nil, nil, nil)
			require.NoError(t, err)
			for _, step := range []string{"admit", "acquire", "tokens"} {
				var c Counting
				ctx := WithCounting(context.Background(), &c)
				refused := false
				switch step {
				case "admit":
					refused = a.Admit(ctx, &policy.Input{Kind: audit.KindToolsCall, Identity: coder}) != nil
				case "acquire":
					release, deny := a.AcquireToolCall(ctx, coder)
					release()
					refused = deny != nil
				case "tokens":
					refused = !a.AddTokens(ctx, coder, 5).Allowed
				}
				assert.Equal(t, tc.wantRefused, refused, step)
				assert.Equal(t, tc.wantUncounted, c.Uncounted(), step)
			}
		})
	}
}
